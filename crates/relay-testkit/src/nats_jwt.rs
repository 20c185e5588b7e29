//! NATS decentralized authentication for tests: an operator, an account with JetStream, and
//! users as `.creds` files, without `nsc`.
//!
//! No well-kept Rust crate builds operator JWTs (`nats-jwt` covers accounts and users only), so
//! this is a small encoder: a JWT is `base64url(header).base64url(claims).base64url(signature)`,
//! signed with the issuer's NKey (ed25519), with the claims nats-server reads (JWT version 2,
//! understood by nats-server 2.2 and later).

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::anyhow;
use data_encoding::BASE64URL_NOPAD;
use nkeys::KeyPair;
use serde_json::{Value, json};

/// Publish and subscribe allow-lists of a user (empty: no restriction on that side).
#[derive(Debug, Clone, Default)]
pub struct UserPermissions {
    /// Subjects the user may publish to.
    pub publish: Vec<String>,
    /// Subjects the user may subscribe to.
    pub subscribe: Vec<String>,
}

/// An operator with one system account and one account (JetStream enabled, no limits); its
/// [`Self::server_config`] runs nats-server in operator mode with an in-memory resolver.
pub struct NatsOperator {
    account: KeyPair,
    operator_jwt: String,
    system_public: String,
    account_jwt: String,
    system_jwt: String,
}

impl std::fmt::Debug for NatsOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsOperator")
            .field("account", &self.account.public_key())
            .finish_non_exhaustive()
    }
}

impl NatsOperator {
    /// A new operator, its system account and an account named `account_name`.
    pub fn new(account_name: &str) -> anyhow::Result<Self> {
        let operator = KeyPair::new_operator();
        let system = KeyPair::new_account();
        let account = KeyPair::new_account();
        let operator_jwt = encode(
            &operator,
            &operator.public_key(),
            "relay-testkit",
            json!({ "type": "operator", "version": 2, "system_account": system.public_key() }),
        )?;
        let unlimited = json!({
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
        });
        let mut with_js = unlimited.clone();
        if let Some(map) = with_js.as_object_mut() {
            // Non-zero storage limits are what enables JetStream for a JWT account.
            for key in ["mem_storage", "disk_storage", "streams", "consumer"] {
                map.insert(key.into(), json!(-1));
            }
        }
        let account_jwt = encode(
            &operator,
            &account.public_key(),
            account_name,
            json!({ "type": "account", "version": 2, "limits": with_js }),
        )?;
        let system_jwt = encode(
            &operator,
            &system.public_key(),
            "SYS",
            json!({ "type": "account", "version": 2, "limits": unlimited }),
        )?;
        Ok(Self {
            account,
            operator_jwt,
            system_public: system.public_key(),
            account_jwt,
            system_jwt,
        })
    }

    /// nats-server configuration text (for [`crate::NatsOptions::config`]): operator mode,
    /// `resolver: MEMORY` preloaded with both accounts.
    pub fn server_config(&self) -> String {
        format!(
            "operator: {op}\nsystem_account: {sys}\nresolver: MEMORY\nresolver_preload: {{\n  {sys}: {sys_jwt}\n  {acc}: {acc_jwt}\n}}\n",
            op = self.operator_jwt,
            sys = self.system_public,
            sys_jwt = self.system_jwt,
            acc = self.account.public_key(),
            acc_jwt = self.account_jwt,
        )
    }

    /// The contents of a `.creds` file for a new user of the account named `name`, limited to
    /// `permissions` (`None`: may publish and subscribe to anything).
    pub fn user_creds(
        &self,
        name: &str,
        permissions: Option<&UserPermissions>,
    ) -> anyhow::Result<String> {
        let user = KeyPair::new_user();
        let mut claims = json!({
            "type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1,
        });
        if let (Some(p), Some(map)) = (permissions, claims.as_object_mut()) {
            let allow = |subjects: &[String]| {
                if subjects.is_empty() {
                    json!({})
                } else {
                    json!({ "allow": subjects })
                }
            };
            map.insert("pub".into(), allow(&p.publish));
            map.insert("sub".into(), allow(&p.subscribe));
        }
        let jwt = encode(&self.account, &user.public_key(), name, claims)?;
        let seed = user.seed().map_err(|e| anyhow!("user NKey seed: {e}"))?;
        // The layout `nsc generate creds` writes; clients find the two blocks by their markers.
        Ok(format!(
            "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\
             NKEYs are sensitive and should be treated as secrets.\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
             *************************************************************\n"
        ))
    }
}

/// A JWT for `subject` issued and signed by `issuer`, with `nats` as the NATS-specific claims.
fn encode(issuer: &KeyPair, subject: &str, name: &str, nats: Value) -> anyhow::Result<String> {
    let header = json!({ "typ": "JWT", "alg": "ed25519-nkey" });
    let iat = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| anyhow!("clock before 1970: {e}"))?
        .as_secs();
    // nats-server does not check the JWT id (nsc uses a hash of the claims); any unique value.
    let jti = BASE64URL_NOPAD.encode(format!("{subject}.{iat}").as_bytes());
    let claims = json!({
        "jti": jti, "iat": iat, "iss": issuer.public_key(), "name": name, "sub": subject,
        "nats": nats,
    });
    let signing_input = format!(
        "{}.{}",
        BASE64URL_NOPAD.encode(header.to_string().as_bytes()),
        BASE64URL_NOPAD.encode(claims.to_string().as_bytes())
    );
    let signature = issuer
        .sign(signing_input.as_bytes())
        .map_err(|e| anyhow!("signing a NATS JWT: {e}"))?;
    Ok(format!(
        "{signing_input}.{}",
        BASE64URL_NOPAD.encode(&signature)
    ))
}
