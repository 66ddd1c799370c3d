//! The gateway's page at `/`, in a real browser: headless Chromium driven through
//! chromedriver's W3C WebDriver HTTP API, against a real gateway → coordinator → CPU
//! worker. The fleet table must show the live worker, and the chat playground must
//! stream an answer, keep the conversation, and finish. A screenshot is left at
//! `target/test-artifacts/gateway_page.png`.

mod common;

use base64::Engine;
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use switchyard::gateway;
use switchyard_config::GatewayConfig;
use switchyard_procs::nats_server::{free_port, kill_with_parent};

/// How long any one thing may take on a slow machine.
const DEADLINE: Duration = Duration::from_secs(60);
/// How long an answer may take (the CPU worker on two cores).
const ANSWER_DEADLINE: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_millis(100);
/// W3C WebDriver's key for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// (chromium, chromedriver) from `PATH` (scripts/setup.sh installs Debian's packages;
/// tests install nothing). `None`, with the reason printed, when they are missing.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let chromium = on_path(&["chromium", "chromium-browser", "google-chrome"]);
    let driver = on_path(&["chromedriver"]);
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        _ => {
            skip(
                Skip::Fixable,
                "chromium and chromedriver are not both on PATH; run scripts/setup.sh (as root it installs \
                 Debian's chromium and chromium-driver) or put a Chromium and its chromedriver on PATH",
            );
            None
        }
    }
}

/// chromedriver in its own process group, with the browsers it starts: the whole
/// group is killed on drop.
struct Chromedriver {
    child: Child,
    url: String,
}

impl Chromedriver {
    async fn start(bin: &Path, http: &reqwest::Client) -> Self {
        use std::os::unix::process::CommandExt;
        let port = free_port().unwrap();
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0);
        kill_with_parent(&mut cmd);
        let child = cmd.spawn().expect("spawn chromedriver");
        let driver = Chromedriver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + DEADLINE;
        loop {
            let ready = match http.get(format!("{}/status", driver.url)).send().await {
                Ok(r) => r.json::<Value>().await.ok().map(|v| v["value"]["ready"] == true),
                Err(_) => None,
            };
            if ready == Some(true) {
                return driver;
            }
            assert!(Instant::now() < deadline, "chromedriver not ready within {DEADLINE:?}");
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group our own child leads.
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// One WebDriver session.
struct Browser {
    http: reqwest::Client,
    session: String,
    driver: Chromedriver,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start(chromium: &Path, chromedriver: &Path) -> Self {
        let http = reqwest::Client::builder().timeout(DEADLINE).build().unwrap();
        let driver = Chromedriver::start(chromedriver, &http).await;
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1400,900", format!("--user-data-dir={}", profile.path().display())],
            },
        }}});
        let url = format!("{}/session", driver.url);
        let r: Value = http.post(url).json(&caps).send().await.unwrap().json().await.unwrap();
        let session = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {r}"))
            .to_string();
        Browser {
            http,
            session,
            driver,
            _profile: profile,
        }
    }

    /// A WebDriver command; its `value`, or a panic with WebDriver's error.
    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.driver.url, self.session);
        let mut req = self.http.request(method.clone(), url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status();
        let v: Value = resp.json().await.unwrap();
        assert!(status.is_success(), "{method} {path}: {status} {}", v["value"]);
        v["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.cmd(reqwest::Method::POST, path, Some(body)).await
    }

    async fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url })).await;
    }

    /// Runs `script` (a function body) in the page and returns its result.
    async fn js(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": []})).await
    }

    async fn element(&self, css: &str) -> String {
        let v = self
            .post("/element", json!({"using": "css selector", "value": css}))
            .await;
        v[ELEMENT].as_str().unwrap_or_else(|| panic!("{css}: {v}")).to_string()
    }

    async fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css).await;
        self.post(&format!("/element/{e}/clear"), json!({})).await;
        self.post(&format!("/element/{e}/value"), json!({ "text": text })).await;
    }

    async fn click(&self, css: &str) {
        let e = self.element(css).await;
        self.post(&format!("/element/{e}/click"), json!({})).await;
    }

    /// Saves a PNG of the viewport under target/test-artifacts/.
    async fn screenshot(&self, name: &str) -> PathBuf {
        let b64 = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        let dir = repo().join("target/test-artifacts");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, png).unwrap();
        path
    }

    /// Polls `script` until it returns `true`; on timeout saves a screenshot, prints
    /// the page's text and panics with `what`.
    async fn wait_until(&self, what: &str, limit: Duration, script: &str) {
        let deadline = Instant::now() + limit;
        while self.js(script).await != true {
            if Instant::now() > deadline {
                let shot = self.screenshot("gateway_page-failure.png").await;
                let text = self.js("return document.body.innerText").await;
                panic!(
                    "{what}: not within {limit:?}; page text:\n{}\nscreenshot: {}",
                    text.as_str().unwrap_or(""),
                    shot.display()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn quit(self) {
        let _ = self.cmd(reqwest::Method::DELETE, "", None).await;
    }
}

/// The worker row's cells, by column header.
const ROW: &str = r#"
    const tr = document.querySelector('#workers-body tr[data-worker="w1"]');
    if (!tr) return null;
    const heads = [...document.querySelectorAll('#workers thead th')].map(th => th.textContent.trim());
    return Object.fromEntries([...tr.cells].map((c, i) => [heads[i], c.textContent.trim()]));
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_fleet_and_streams_a_chat_in_a_real_browser() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let started = Instant::now();
    let f = fleet(|c| c.worker.capacity = 2).await;
    let config = GatewayConfig {
        listen: "127.0.0.1:0".into(),
        ..GatewayConfig::default()
    };
    let g = gateway::start(f.client().await, "sy", &config)
        .await
        .expect("gateway starts");
    let browser = Browser::start(&chromium, &chromedriver).await;
    browser.goto(&format!("{}/", g.url())).await;
    assert_eq!(browser.js("return document.title").await, "switchyard");

    // The fleet table: the live worker, its device, model and state.
    browser
        .wait_until(
            "the workers table shows w1 on cpu",
            DEADLINE,
            &format!("const r = (() => {{ {ROW} }})(); return !!r && r.Worker === 'w1' && r.Device.startsWith('cpu');"),
        )
        .await;
    let row = browser.js(ROW).await;
    eprintln!("worker row: {row}");
    assert_eq!(row["Backend"], "cpu");
    assert_eq!(row["Model"], DEMO_NAME);
    assert_eq!(row["Load"], "0/2");
    assert_eq!(row["State"], "available");
    let slots = row["KV slots"].as_str().unwrap().split_once('/').unwrap();
    assert!(slots.0 == "0" && slots.1.parse::<u32>().unwrap() >= 2, "{row}");
    let status = browser
        .js("return document.getElementById('fleet-status').textContent")
        .await;
    assert!(status.as_str().unwrap().contains("1 worker(s)"), "{status}");
    // Refreshed live: the "updated" time moves on.
    let updated = browser
        .js("return document.getElementById('updated').textContent")
        .await;
    assert!(updated.as_str().unwrap().contains("updated"), "{updated}");
    browser
        .wait_until(
            "the fleet refreshes",
            DEADLINE,
            &format!("return document.getElementById('updated').textContent !== {updated}"),
        )
        .await;
    // The model select, filled from /v1/models.
    browser
        .wait_until(
            "the model list loads",
            DEADLINE,
            &format!("return document.getElementById('model').value === {}", json!(DEMO_NAME)),
        )
        .await;

    // The chat: type, send, and watch the answer stream in.
    browser.type_into("#max-tokens", "48").await;
    let prompt = "What is the capital of France?";
    browser.type_into("#prompt", prompt).await;
    // Every distinct text the answer shows while it streams.
    browser
        .js(
            "window.seen = new Set(); new MutationObserver(() => { const a = document.getElementById('answer'); \
             if (a && a.dataset.done === 'false' && a.textContent) seen.add(a.textContent); }) \
             .observe(document.getElementById('chat'), {subtree: true, childList: true, characterData: true});",
        )
        .await;
    browser.click("#send").await;
    let done = "const a = document.getElementById('answer'); return !!a && a.dataset.done === 'true' \
                && !document.getElementById('send').disabled;";
    browser
        .wait_until("the first answer finishes", ANSWER_DEADLINE, done)
        .await;
    let turn = r#"
        const a = document.getElementById('answer');
        return {answer: a.textContent, failed: a.classList.contains('failed'),
                status: document.getElementById('chat-status').textContent,
                users: [...document.querySelectorAll('#chat .msg.user')].map(m => m.textContent),
                assistants: document.querySelectorAll('#chat .msg.assistant').length,
                prompt: document.getElementById('prompt').value,
                conversation: conversation.length};
    "#;
    let t = browser.js(turn).await;
    eprintln!("first turn: {t:#}");
    assert!(!t["answer"].as_str().unwrap().trim().is_empty(), "{t}");
    assert_eq!(t["failed"], false, "{t}");
    assert!(t["status"].as_str().unwrap().starts_with("finish: "), "{t}");
    assert_eq!(t["users"], json!([prompt]));
    assert_eq!(t["assistants"], 1);
    assert_eq!(t["prompt"], "", "the textarea is cleared on send");
    assert_eq!(t["conversation"], 2);
    // Rendered as it streamed, not all at the end.
    let tokens: u32 = t["status"]
        .as_str()
        .unwrap()
        .split(" · ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let seen = browser.js("return seen.size").await.as_u64().unwrap();
    eprintln!("{tokens} tokens, shown in {seen} steps");
    assert!(
        tokens < 3 || seen >= 2,
        "{tokens} tokens arrived but the answer was shown in {seen} step(s)"
    );

    // A second turn goes out with the whole conversation.
    browser.type_into("#prompt", "And of Germany?").await;
    browser.click("#send").await;
    browser
        .wait_until(
            "the second answer starts",
            DEADLINE,
            "return document.querySelectorAll('#chat .msg.assistant').length === 2",
        )
        .await;
    browser
        .wait_until("the second answer finishes", ANSWER_DEADLINE, done)
        .await;
    let t = browser.js(turn).await;
    eprintln!("second turn: {t:#}");
    assert!(!t["answer"].as_str().unwrap().trim().is_empty(), "{t}");
    assert_eq!(t["failed"], false, "{t}");
    assert_eq!(t["conversation"], 4, "{t}");
    // Only the latest answer carries the id.
    assert_eq!(
        browser.js("return document.querySelectorAll('#answer').length").await,
        1
    );

    // The live table catches up with the two finished requests.
    browser
        .wait_until(
            "the table counts the two requests",
            DEADLINE,
            &format!("const r = (() => {{ {ROW} }})(); return !!r && Number(r.Done) >= 2 && r.Load === '0/2';"),
        )
        .await;
    eprintln!("worker row after chat: {}", browser.js(ROW).await);

    let shot = browser.screenshot("gateway_page.png").await;
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{}", shot.display());
    eprintln!("screenshot: {} ({} bytes)", shot.display(), png.len());

    // With the gateway gone, the page says so and keeps the last table.
    g.shutdown().await;
    browser
        .wait_until(
            "the page reports the failed fetch",
            DEADLINE,
            "const s = document.getElementById('fleet-status'); return s.classList.contains('err') \
             && s.textContent.startsWith('fleet fetch failed') \
             && document.getElementById('updated').textContent.includes('stale, last updated') \
             && document.getElementById('workers-body').classList.contains('stale');",
        )
        .await;
    assert!(browser.js(ROW).await.is_object(), "the last table stays");
    browser.screenshot("gateway_page-offline.png").await;
    browser.quit().await;
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
}
