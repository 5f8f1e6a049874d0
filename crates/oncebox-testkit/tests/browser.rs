//! The browser against a page served by axum on 127.0.0.1: it reads the page as shown,
//! waits for what a script adds, submits a form, sees the cookies' flags and takes a
//! screenshot of the viewport's size. Without Chromium these tests fail, saying how to
//! install it.

use std::collections::HashMap;

use axum::Form;
use axum::Router;
use axum::http::header::SET_COOKIE;
use axum::response::{AppendHeaders, Html, IntoResponse};
use axum::routing::{get, post};
use oncebox_testkit::browser::{Browser, BrowserOptions, SameSite};
use tokio::net::TcpListener;

/// Text a page must show as text, never run.
const HOSTILE: &str = "<script>document.title = 'injected'</script> & <b>bold</b>";

/// Serves the page on a free port of 127.0.0.1; its address, as `http://127.0.0.1:PORT`.
async fn serve() -> String {
    let app = Router::new()
        .route("/", get(page))
        .route("/search", post(search));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("the page's server listens");
    let address = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

/// The page: data that looks like markup, a link, a list, a form, an element a script
/// adds late, and two cookies.
async fn page() -> impl IntoResponse {
    let html = format!(
        r#"<!doctype html>
<html><head><title>Orders</title></head>
<body>
  <h1>Orders</h1>
  <p id="note">{note}</p>
  <a id="next" href="/search?page=2">next</a>
  <ul><li>first</li><li>second</li></ul>
  <form id="search" method="post" action="/search">
    <input name="q" value="placeholder">
    <button>Search</button>
  </form>
  <script>
    setTimeout(() => {{
      const late = document.createElement("p");
      late.id = "late";
      late.textContent = "loaded later";
      document.body.append(late);
    }}, 200);
  </script>
</body></html>"#,
        note = escape(HOSTILE),
    );
    (
        AppendHeaders([
            (
                SET_COOKIE,
                "session=s3cret; Path=/; HttpOnly; SameSite=Strict",
            ),
            (SET_COOKIE, "theme=dark; Path=/; SameSite=Lax"),
        ]),
        Html(html),
    )
}

/// What the form sent, shown back.
async fn search(Form(form): Form<HashMap<String, String>>) -> Html<String> {
    let query = form.get("q").map_or("", String::as_str);
    Html(format!(
        "<!doctype html><title>Results</title><p id=\"result\">You searched for {}</p>",
        escape(query)
    ))
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn launch() -> Browser {
    Browser::launch(BrowserOptions::new())
        .await
        .expect("a headless Chromium starts (scripts/services.sh browser installs it)")
}

#[tokio::test]
async fn reads_the_page_as_shown() {
    let base = serve().await;
    let browser = launch().await;
    browser.goto(&base).await.expect("the page loads");

    assert_eq!(browser.title().await.expect("a title"), "Orders");
    assert_eq!(browser.text("h1").await.expect("a heading"), "Orders");
    assert_eq!(
        browser.text("#note").await.expect("the note"),
        HOSTILE,
        "markup in the data is shown as text"
    );
    assert!(
        !browser
            .exists("#note script, #note b")
            .await
            .expect("a query"),
        "markup in the data makes no elements"
    );
    assert_eq!(
        browser.attribute("#next", "href").await.expect("the link"),
        Some("/search?page=2".to_owned())
    );
    assert_eq!(
        browser.attribute("#next", "title").await.expect("the link"),
        None
    );
    assert_eq!(
        browser.texts("li").await.expect("the list"),
        ["first", "second"]
    );
    assert!(browser.texts("table tr").await.expect("a query").is_empty());

    let missing = browser.text("#absent").await.expect_err("no such element");
    assert!(
        missing.to_string().contains("#absent"),
        "the error names the selector: {missing}"
    );

    browser.wait_for("#late").await.expect("the script adds it");
    assert_eq!(browser.text("#late").await.expect("it"), "loaded later");
    browser.close().await.expect("the session ends");
}

#[tokio::test]
async fn submits_a_form_and_sees_the_result() {
    let base = serve().await;
    let browser = launch().await;
    browser.goto(&base).await.expect("the page loads");

    browser
        .fill("#search input[name=q]", "<i>sprockets</i>")
        .await
        .expect("the field takes text");
    browser.submit("#search").await.expect("the form submits");

    assert_eq!(
        browser.current_url().await.expect("a URL"),
        format!("{base}/search")
    );
    assert_eq!(
        browser.text("#result").await.expect("the result"),
        "You searched for <i>sprockets</i>",
        "the field's previous value was replaced, the markup shown as text"
    );
    assert!(
        browser
            .submit("#result")
            .await
            .expect_err("not a form with a button")
            .to_string()
            .contains("#result"),
    );
}

#[tokio::test]
async fn reads_the_cookies_with_their_flags() {
    let base = serve().await;
    let browser = launch().await;
    browser.goto(&base).await.expect("the page loads");

    let session = browser
        .cookie("session")
        .await
        .expect("the cookies")
        .expect("the session cookie was set");
    assert_eq!(session.value, "s3cret");
    assert_eq!(session.path.as_deref(), Some("/"));
    assert!(session.http_only);
    assert!(!session.secure);
    assert_eq!(session.same_site, Some(SameSite::Strict));

    let theme = browser
        .cookie("theme")
        .await
        .expect("the cookies")
        .expect("the theme cookie was set");
    assert!(!theme.http_only);
    assert_eq!(theme.same_site, Some(SameSite::Lax));
    assert_eq!(browser.cookies().await.expect("the cookies").len(), 2);
    assert_eq!(browser.cookie("absent").await.expect("the cookies"), None);

    let seen_by_scripts = browser
        .webdriver()
        .execute("return document.cookie", Vec::new())
        .await
        .expect("a script runs");
    assert_eq!(
        seen_by_scripts, "theme=dark",
        "the page's scripts see only the cookie without HttpOnly"
    );
}

#[tokio::test]
async fn takes_a_screenshot_of_the_viewport() {
    let base = serve().await;
    let browser = launch().await;
    browser.goto(&base).await.expect("the page loads");
    let directory = tempfile::tempdir().expect("a temporary directory");

    let path = directory.path().join("screenshots/orders/page.png");
    browser.screenshot(&path).await.expect("a screenshot");
    let png = std::fs::read(&path).expect("the screenshot was written");
    assert_eq!(png_size(&png), (1280, 800), "the default viewport");

    browser
        .set_viewport_size(800, 600)
        .await
        .expect("the window resizes");
    assert_eq!(browser.viewport_size().await.expect("a size"), (800, 600));
    browser.screenshot(&path).await.expect("a screenshot");
    let png = std::fs::read(&path).expect("the screenshot was written");
    assert_eq!(png_size(&png), (800, 600));
}

#[tokio::test]
async fn without_chromedriver_launching_says_how_to_install_it() {
    let options = BrowserOptions::new().chromedriver("oncebox-no-such-chromedriver");
    let error = Browser::launch(options)
        .await
        .expect_err("there is no such program");
    assert!(error.is_not_installed(), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("apt-get install chromium chromium-driver"),
        "{error}"
    );
}

/// The width and height of a PNG, after checking its signature and header chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG: {:?}",
        &png[..png.len().min(8)]
    );
    assert_eq!(&png[12..16], b"IHDR", "the first chunk is the header");
    let number = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().expect("4 bytes"));
    (number(16), number(20))
}
