//! Opening the connection: the servers and the credentials and TLS configuration of
//! [`ConnectOptions`] (resolved by the caller), TCP, TLS (rustls), `INFO`, `CONNECT` and the
//! first `PING`/`PONG`.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use nkeys::KeyPair;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::proto::{self, ConnectInfo, ServerInfo, ServerOp};

/// The default NATS port.
const DEFAULT_PORT: u16 = 4222;

/// One server to connect to: configured, or learned from an `INFO`'s `connect_urls`.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerUrl {
    pub host: String,
    pub port: u16,
    /// `tls://`.
    tls: bool,
    /// Userinfo in the URL: `user:password@` or `token@`.
    user: Option<String>,
    password: Option<String>,
}

impl std::fmt::Debug for ServerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the userinfo.
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl ServerUrl {
    /// `[scheme://][user[:password]@]host[:port]`; `nats`, `tls` (or none) as scheme.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
            None => ("nats".to_owned(), text),
        };
        let tls = match scheme.as_str() {
            "nats" => false,
            "tls" => true,
            other => {
                return Err(format!(
                    "unsupported URL scheme `{other}` (nats:// or tls://)"
                ));
            }
        };
        let rest = rest.trim_end_matches('/');
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, rest),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => match info.split_once(':') {
                Some((user, password)) => (Some(decode(user)), Some(decode(password))),
                None => (Some(decode(info)), None),
            },
        };
        let (host, port) = match hostport.rsplit_once(':') {
            // `[::1]:4222`, `host:4222`; a bare IPv6 address has more than one colon.
            Some((host, port)) if !host.contains(':') || host.ends_with(']') => (
                host,
                port.parse::<u16>()
                    .map_err(|_| format!("bad port in `{hostport}`"))?,
            ),
            _ => (hostport, DEFAULT_PORT),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err("no host".into());
        }
        Ok(Self {
            host: host.to_owned(),
            port,
            tls,
            user,
            password,
        })
    }

    fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// How the connection authenticates and verifies servers: resolved by the caller, once, and
/// shareable with another client of the same servers.
pub trait Credentials: Send + Sync {
    /// A user and its password.
    fn user(&self) -> Option<(&str, &str)>;
    fn token(&self) -> Option<&str>;
    /// An NKey: its public key goes in `CONNECT`, and it signs the server's nonce.
    fn nkey(&self) -> Option<&KeyPair>;
    /// A user JWT and the key that signs the nonce (a `.creds` file).
    fn jwt(&self) -> Option<(&str, &KeyPair)>;
    /// The TLS configuration, or why there is none: asked only when TLS is used.
    fn tls(&self) -> Result<&Arc<rustls::ClientConfig>, &str>;
}

/// What [`ConnectOptions::on_server_error`] calls.
pub type ServerErrorObserver = Arc<dyn Fn(&str) + Send + Sync>;

/// Everything needed to (re)connect.
#[derive(Clone)]
pub struct ConnectOptions {
    pub servers: Vec<ServerUrl>,
    pub credentials: Arc<dyn Credentials>,
    /// TLS even where neither the URL nor the server asks for it.
    pub tls_required: bool,
    /// The longest one connection attempt (TCP, TLS, handshake) may take.
    pub connect_timeout: Duration,
    /// The servers as messages name them, with passwords replaced.
    pub display_url: String,
    /// The name in `CONNECT` (the server's monitoring shows it).
    pub name: String,
    /// Called with each `-ERR` text after which the server keeps the connection (a permissions
    /// violation, say), so that the caller can explain a refused publish.
    pub on_server_error: Option<ServerErrorObserver>,
    /// The JetStream domain every PubAck must name (`None`: any, or none).
    pub domain: Option<Arc<str>>,
    /// The stream every PubAck must name (`None`: any). An answer naming another stream is not
    /// the stream's: another stream with the subject, or another client answering the reply
    /// subject first.
    pub stream: Option<Arc<str>>,
    /// The first tokens of every reply subject of the connection (`<prefix>.<unique>.…`).
    /// Default `_INBOX`, the prefix every NATS client shares.
    pub inbox_prefix: String,
}

impl ConnectOptions {
    /// Options for the comma-separated server URLs `urls` (`[nats://|tls://][user[:password]@]
    /// host[:port]`), authenticating with `credentials`: no TLS unless a URL or the server asks
    /// for it, 5 s per connection attempt, `urls` in messages (set `display_url` when they hold
    /// a password). The error names the URL that is not one.
    pub fn new(urls: &str, credentials: Arc<dyn Credentials>) -> Result<Self, String> {
        let servers = urls
            .split(',')
            .map(|url| ServerUrl::parse(url).map_err(|e| format!("`{}`: {e}", url.trim())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            servers,
            credentials,
            tls_required: false,
            connect_timeout: Duration::from_secs(5),
            display_url: urls.to_owned(),
            name: "nats-wire".to_owned(),
            on_server_error: None,
            domain: None,
            stream: None,
            inbox_prefix: "_INBOX".to_owned(),
        })
    }
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("url", &self.display_url)
            .finish_non_exhaustive()
    }
}

/// The read half of a connection.
pub(crate) type Reader = Box<dyn AsyncRead + Send + Unpin>;
/// The write half of a connection.
pub(crate) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// An open connection after the handshake.
pub(crate) struct Opened {
    pub(crate) reader: Reader,
    pub(crate) writer: Writer,
    pub(crate) info: ServerInfo,
    /// Bytes read past the handshake's `PONG` (the start of what follows).
    pub(crate) leftover: BytesMut,
}

/// Why a connection attempt failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Protocol(#[from] proto::ProtocolError),
    /// The server answered `CONNECT` with `-ERR` (authorization, TLS required, ...).
    #[error("the server refused the connection: -ERR '{0}'")]
    Refused(String),
    #[error("no answer within nats.connect_timeout ({0:?})")]
    TimedOut(Duration),
    #[error("{0}")]
    Tls(String),
}

/// Connects to `server`: `INFO`, TLS when the URL, the settings or the server ask for it,
/// `CONNECT` with the credentials, `first` (written before the `PING`, e.g. the `SUB` for
/// PubAcks), and waits for the `PONG` that proves the server took them.
pub(crate) async fn open(
    settings: &ConnectOptions,
    server: &ServerUrl,
    first: &[u8],
) -> Result<Opened, OpenError> {
    let timeout = settings.connect_timeout;
    tokio::time::timeout(timeout, handshake(settings, server, first))
        .await
        .map_err(|_| OpenError::TimedOut(timeout))?
}

// Long: the connection handshake in protocol order (INFO, TLS, CONNECT, PING/PONG); each step needs
// the previous one's state
async fn handshake(
    settings: &ConnectOptions,
    server: &ServerUrl,
    first: &[u8],
) -> Result<Opened, OpenError> {
    let tcp = TcpStream::connect(server.addr()).await?;
    tcp.set_nodelay(true)?;
    let mut buf = BytesMut::with_capacity(4096);
    let mut tcp = tcp;
    let info = match read_op(&mut tcp, &mut buf, proto::message_limit(0)).await? {
        ServerOp::Info(text) => text.parse()?,
        // e.g. `maximum connections exceeded`, sent on accept.
        ServerOp::Err(text) => return Err(OpenError::Refused(text)),
        other => {
            return Err(proto::ProtocolError(format!("expected INFO, got {other:?}")).into());
        }
    };
    if !info.headers {
        return Err(proto::ProtocolError(format!(
            "nats-server {} does not support headers (2.2 or later needed)",
            info.version
        ))
        .into());
    }
    let use_tls = server.tls || settings.tls_required || info.tls_required;
    let (mut reader, mut writer): (Reader, Writer) = if use_tls {
        if !buf.is_empty() {
            return Err(proto::ProtocolError("data after INFO before TLS".into()).into());
        }
        let name = ServerName::try_from(server.host.clone())
            .map_err(|e| OpenError::Tls(format!("`{}` as a TLS server name: {e}", server.host)))?;
        let config = settings
            .credentials
            .tls()
            .map_err(|e| OpenError::Tls(e.to_owned()))?;
        let tls = tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| OpenError::Tls(format!("TLS handshake failed: {e}")))?;
        let (r, w) = tokio::io::split(tls);
        (Box::new(r), Box::new(w))
    } else {
        let (r, w) = tcp.into_split();
        (Box::new(r), Box::new(w))
    };
    let signature = |pair: &KeyPair| -> Result<String, OpenError> {
        let nonce = info.nonce.as_deref().unwrap_or_default();
        let signed = pair
            .sign(nonce.as_bytes())
            .map_err(|e| OpenError::Refused(format!("cannot sign the server's nonce: {e}")))?;
        Ok(data_encoding::BASE64URL_NOPAD.encode(&signed))
    };
    let auth = &*settings.credentials;
    let nkey_public = auth.nkey().map(KeyPair::public_key);
    let sig = match (auth.jwt(), auth.nkey()) {
        (Some((_, pair)), _) => Some(signature(pair)?),
        (None, Some(nkey)) => Some(signature(nkey)?),
        (None, None) => None,
    };
    // The credentials first; the URL's userinfo when they name no user or token.
    let (user, pass, token) = match (auth.user(), auth.token()) {
        (None, None) => match (&server.user, &server.password) {
            (Some(user), Some(password)) => (Some(user.as_str()), Some(password.as_str()), None),
            (Some(token), None) => (None, None, Some(token.as_str())),
            _ => (None, None, None),
        },
        (user, token) => (user.map(|(u, _)| u), user.map(|(_, p)| p), token),
    };
    let connect = ConnectInfo {
        verbose: false,
        pedantic: false,
        tls_required: use_tls,
        name: &settings.name,
        lang: "rust",
        version: env!("CARGO_PKG_VERSION"),
        protocol: 1,
        echo: true,
        headers: true,
        no_responders: true,
        user,
        pass,
        auth_token: token,
        jwt: auth.jwt().map(|(jwt, _)| jwt),
        nkey: if auth.jwt().is_none() {
            nkey_public.as_deref()
        } else {
            None
        },
        sig: sig.as_deref(),
    };
    let mut out = BytesMut::new();
    proto::write_connect(&mut out, &connect);
    out.extend_from_slice(first);
    out.extend_from_slice(b"PING\r\n");
    writer.write_all(&out).await?;
    writer.flush().await?;
    let mut info = info;
    loop {
        match read_op(
            &mut reader,
            &mut buf,
            proto::message_limit(info.max_payload),
        )
        .await?
        {
            ServerOp::Pong => break,
            ServerOp::Err(text) => return Err(OpenError::Refused(text)),
            ServerOp::Info(text) => info = text.parse()?,
            ServerOp::Ping => {
                writer.write_all(b"PONG\r\n").await?;
            }
            ServerOp::Ok | ServerOp::Msg { .. } => {}
        }
    }
    Ok(Opened {
        reader,
        writer,
        info,
        leftover: buf,
    })
}

/// Reads until one whole operation is in `buf` and takes it.
async fn read_op<R: AsyncRead + Unpin + ?Sized>(
    reader: &mut R,
    buf: &mut BytesMut,
    limit: usize,
) -> Result<ServerOp, OpenError> {
    loop {
        if let Some(op) = proto::parse_op(buf, limit)? {
            return Ok(op);
        }
        buf.reserve(4096);
        if reader.read_buf(buf).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server closed the connection during the handshake",
            )
            .into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_parse() {
        let url = ServerUrl::parse("nats://relay:p%40ss@10.0.0.1:4333").unwrap();
        assert_eq!(
            (url.host.as_str(), url.port, url.tls),
            ("10.0.0.1", 4333, false)
        );
        assert_eq!(
            (url.user.as_deref(), url.password.as_deref()),
            (Some("relay"), Some("p@ss"))
        );
        let url = ServerUrl::parse(" tls://tok@localhost ").unwrap();
        assert_eq!(
            (url.host.as_str(), url.port, url.tls),
            ("localhost", 4222, true)
        );
        assert_eq!((url.user.as_deref(), url.password), (Some("tok"), None));
        let url = ServerUrl::parse("127.0.0.1:5000").unwrap();
        assert_eq!((url.addr().as_str(), url.tls), ("127.0.0.1:5000", false));
        let url = ServerUrl::parse("nats://[::1]:4222").unwrap();
        assert_eq!(url.addr(), "[::1]:4222");
        assert!(ServerUrl::parse("http://x:1").is_err());
        assert!(ServerUrl::parse("nats://x:port").is_err());
    }
}
