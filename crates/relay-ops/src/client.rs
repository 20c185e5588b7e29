//! The tiny HTTP client `outbox-relay status` and `health` ask a running relay's endpoints with
//! (`[http] listen`, or `--relay`).

use std::time::Duration;

use anyhow::Context as _;
use http_body_util::{BodyExt, Empty};
use hyper::header;

/// `GET http://{addr}{path}`: status code and body.
pub async fn get_text(addr: &str, path: &str, timeout: Duration) -> anyhow::Result<(u16, String)> {
    tokio::time::timeout(timeout, async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header(header::HOST, addr)
            .body(Empty::<bytes::Bytes>::new())?;
        let response = sender.send_request(request).await?;
        let code = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((code, String::from_utf8_lossy(&body).into_owned()))
    })
    .await
    .with_context(|| format!("no answer from {addr} within {timeout:?}"))?
}
