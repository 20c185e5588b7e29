//! The document's ids: made of the configuration's names, reduced to the characters AsyncAPI
//! allows in component keys (`[A-Za-z0-9._-]`) and made unique.

/// `name` with every character AsyncAPI does not allow in a component key (`[A-Za-z0-9._-]`)
/// replaced by `_`, so it is a key and a JSON Pointer token as it stands.
pub(crate) fn component_key(name: &str) -> String {
    let key: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if key.is_empty() { "_".to_owned() } else { key }
}

/// `base`, or `base-2`, `base-3`, … : the first that `taken` says is free.
pub(crate) fn unique(base: &str, taken: impl Fn(&str) -> bool) -> String {
    if !taken(base) {
        return base.to_owned();
    }
    (2..)
        .map(|n| format!("{base}-{n}"))
        .find(|candidate| !taken(candidate))
        .unwrap_or_else(|| base.to_owned())
}
