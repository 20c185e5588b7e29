//! A real browser a test can click in: Debian's `chromedriver` driving headless Chromium over
//! the W3C WebDriver protocol (plain JSON over HTTP), on a free port, ended with the test.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use http_body_util::{BodyExt as _, Full};
use serde_json::{Value, json};

/// The key under which WebDriver names an element.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A Chromium session under chromedriver.
pub struct Browser {
    driver: Child,
    addr: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver (`RELAY_TEST_CHROMEDRIVER`, else `/usr/bin/chromedriver`) and a
    /// headless Chromium session.
    pub async fn start(chromium: &Path) -> Result<Self> {
        let driver_bin = std::env::var_os("RELAY_TEST_CHROMEDRIVER")
            .unwrap_or_else(|| "/usr/bin/chromedriver".into());
        ensure!(
            Path::new(&driver_bin).exists(),
            "{} not found: run scripts/ensure-deps.sh (installs Debian's chromium-driver) or set RELAY_TEST_CHROMEDRIVER",
            Path::new(&driver_bin).display()
        );
        let port = relay_testkit::free_port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start chromedriver")?;
        let profile = tempfile::tempdir()?;
        let mut browser = Self {
            driver,
            addr: format!("127.0.0.1:{port}"),
            session: String::new(),
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while browser.call("GET", "/status", None).await.is_err() {
            ensure!(
                Instant::now() < deadline,
                "chromedriver did not answer on {port}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = browser._profile.path().display().to_string();
        let created = browser
            .call(
                "POST",
                "/session",
                Some(json!({ "capabilities": { "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": chromium,
                        // CI runs as root, where Chromium's sandbox cannot start.
                        "args": ["--headless", "--no-sandbox", "--disable-gpu",
                                 "--disable-dev-shm-usage", "--hide-scrollbars",
                                 "--window-size=1280,1000",
                                 format!("--user-data-dir={profile}")],
                    },
                }}})),
            )
            .await?;
        browser.session = created["sessionId"]
            .as_str()
            .context("no session id")?
            .to_owned();
        Ok(browser)
    }

    /// One WebDriver command; its `value`.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let stream = tokio::net::TcpStream::connect(&self.addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.addr)
            .header("content-type", "application/json")
            .body(Full::new(hyper::body::Bytes::from(body)))?;
        let response = tokio::time::timeout(Duration::from_secs(60), sender.send_request(request))
            .await
            .with_context(|| format!("{method} {path}: no answer"))??;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        let answer: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("{method} {path}: {}", String::from_utf8_lossy(&bytes)))?;
        if !status.is_success() {
            bail!("{method} {path}: {status} {}", answer["value"]);
        }
        Ok(answer["value"].clone())
    }

    fn at(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Opens `url` and waits (30 s) until the console's view of its fragment (`#events/…`: the
    /// view `events`; `#token=…`: the overview) says it loaded.
    pub async fn open(&self, url: &str) -> Result<()> {
        let fragment = url.split_once('#').map_or("", |(_, f)| f);
        let view = match fragment.split('/').next().unwrap_or_default() {
            "" => "overview",
            token if token.starts_with("token=") => "overview",
            view => view,
        };
        self.open_view(url, view).await
    }

    /// Opens `url` and waits (30 s) until the page says its view `view` loaded (the fleet
    /// page's is `fleet`).
    pub async fn open_view(&self, url: &str, view: &str) -> Result<()> {
        self.call("POST", &self.at("/url"), Some(json!({ "url": url })))
            .await?;
        // A new fragment on the same page is no new page: wait for that view, not any load.
        self.wait_for(
            &format!("the view {view} loaded"),
            &format!(
                "return document.body.dataset.view === '{view}' && document.body.dataset.loaded === 'true'"
            ),
        )
        .await
    }

    /// Waits (30 s) until `script` returns true.
    pub async fn wait_for(&self, what: &str, script: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.run(script).await? == json!(true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{what}: not within 30 s; page: {}",
                    self.text("body").await?
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `script` in the page; what it returns.
    pub async fn run(&self, script: &str) -> Result<Value> {
        self.call(
            "POST",
            &self.at("/execute/sync"),
            Some(json!({ "script": script, "args": [] })),
        )
        .await
    }

    async fn element(&self, css: &str) -> Result<String> {
        let found = self
            .call(
                "POST",
                &self.at("/element"),
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await
            .with_context(|| format!("no element {css}"))?;
        Ok(found[ELEMENT]
            .as_str()
            .with_context(|| format!("{css}: no element id in {found}"))?
            .to_owned())
    }

    /// Clicks the element `css` as a person would.
    pub async fn click(&self, css: &str) -> Result<()> {
        let id = self.element(css).await?;
        self.call(
            "POST",
            &self.at(&format!("/element/{id}/click")),
            Some(json!({})),
        )
        .await?;
        Ok(())
    }

    /// Types `text` into the element `css` as a person would.
    pub async fn type_into(&self, css: &str, text: &str) -> Result<()> {
        let id = self.element(css).await?;
        self.call(
            "POST",
            &self.at(&format!("/element/{id}/value")),
            Some(json!({ "text": text })),
        )
        .await?;
        Ok(())
    }

    /// The text the element `css` shows.
    pub async fn text(&self, css: &str) -> Result<String> {
        let id = self.element(css).await?;
        let text = self
            .call("GET", &self.at(&format!("/element/{id}/text")), None)
            .await?;
        Ok(text.as_str().unwrap_or_default().to_owned())
    }

    /// Saves what the window shows as a PNG at `path`.
    pub async fn screenshot(&self, path: &Path) -> Result<()> {
        let encoded = self.call("GET", &self.at("/screenshot"), None).await?;
        let png = data_encoding::BASE64
            .decode(encoded.as_str().context("screenshot")?.as_bytes())
            .context("screenshot is not base64")?;
        std::fs::write(path, png)?;
        Ok(())
    }
}

impl Browser {
    /// Ends the session (and its Chromium), then the driver.
    pub async fn close(self) -> Result<()> {
        self.call("DELETE", &self.at(""), None).await?;
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
