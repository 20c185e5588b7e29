//! PostgreSQL's `server_version_num` as people read it, for the messages that name a server's
//! version (start-up checks, settings, shards, failover).

/// `150019` → `15.19`.
#[must_use]
pub(crate) fn version_text(server_version_num: i32) -> String {
    format!(
        "{}.{}",
        server_version_num / 10_000,
        server_version_num % 10_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_and_minor_as_postgresql_prints_them() {
        assert_eq!(version_text(150_019), "15.19");
        assert_eq!(version_text(180_000), "18.0");
        assert_eq!(version_text(170_005), "17.5");
    }
}
