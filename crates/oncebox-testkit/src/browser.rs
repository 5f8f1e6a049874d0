//! A headless Chromium driven through chromedriver (feature `browser`), for tests of web
//! pages: load a page, read and fill it, submit its forms, check the cookies it set and
//! take a screenshot.
//!
//! Each [`Browser`] starts a chromedriver of its own on a free port of 127.0.0.1 and,
//! through it, a headless Chromium with a fresh profile, so tests run in parallel and
//! share no cookies or storage. Dropping the browser ends both processes and removes the
//! profile.
//!
//! The browser is Debian's `chromium` with its driver, `chromium-driver`, which
//! `scripts/services.sh browser` installs. Without chromedriver, [`Browser::launch`] fails
//! with [`Error::NotInstalled`], which says how to install it: a test never passes for
//! want of a browser.
//!
//! Chromium runs without its sandbox (tests run as root in containers), without a GPU,
//! and without the background connections (updates, sync, first-run) that stall it on a
//! machine with no network.
//!
//! ```no_run
//! # async fn example() -> oncebox_testkit::browser::Result<()> {
//! use oncebox_testkit::browser::{Browser, BrowserOptions};
//!
//! let browser = Browser::launch(BrowserOptions::new()).await?;
//! browser.goto("http://127.0.0.1:8080/login").await?;
//! browser.fill("input[name=user]", "ada").await?;
//! browser.submit("form#login").await?;
//! assert_eq!(browser.text("h1").await?, "Welcome, ada");
//! let session = browser.cookie("session").await?.expect("a session cookie");
//! assert!(session.http_only);
//! browser.screenshot("target/screenshots/welcome.png").await?;
//! browser.close().await?;
//! # Ok(()) }
//! ```

mod cookie;
mod driver;
mod error;
mod options;

use std::path::Path;
use std::time::Duration;

use fantoccini::elements::Element;
use fantoccini::error::CmdError;
use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use tempfile::TempDir;

pub use self::cookie::{Cookie, SameSite};
use self::driver::Chromedriver;
pub use self::error::{Error, Result};
pub use self::options::BrowserOptions;

/// Headless, and quiet on the network: none of the connections Chromium makes on its own
/// (component updates, sync, background requests, QUIC), which a closed network refuses
/// and which then stall it.
const CHROMIUM_ARGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// What submits a form when clicked.
const SUBMIT_BUTTON: &str =
    "button:not([type]), button[type=submit], input[type=submit], input[type=image]";

/// A headless Chromium with one window, driven through its own chromedriver.
///
/// Every method that takes a `selector` (CSS) acts on the first element of the current
/// page that matches it, and fails with [`Error::NoSuchElement`] when none does; only
/// [`wait_for`](Self::wait_for) waits for one to appear.
///
/// Dropping the browser kills chromedriver and Chromium and removes the profile;
/// [`close`](Self::close) first ends the session as WebDriver does.
///
/// # Cancel safety
///
/// A call whose future is dropped may still be carried out by the browser; the next call
/// runs after it.
#[derive(Debug)]
pub struct Browser {
    // Dropped in this order: the WebDriver client, then chromedriver with its Chromium
    // (killed), then the profile Chromium wrote to.
    client: Client,
    _driver: Chromedriver,
    _profile: TempDir,
    timeout: Duration,
}

impl Browser {
    /// Starts chromedriver and, through it, a headless Chromium with a fresh profile and
    /// a viewport of the options' size.
    ///
    /// # Errors
    ///
    /// [`Error::NotInstalled`] when there is no chromedriver; [`Error::Start`],
    /// [`Error::Exited`] or [`Error::NotListening`] when it does not start;
    /// [`Error::Session`] when it cannot start Chromium.
    pub async fn launch(options: BrowserOptions) -> Result<Self> {
        let profile = tempfile::Builder::new()
            .prefix("oncebox-chromium-")
            .tempdir()
            .map_err(Error::Start)?;
        let driver = Chromedriver::start(&options.chromedriver, options.timeout).await?;
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities(&options, profile.path()))
            .connect(&driver.url())
            .await
            .map_err(|error| Error::Session(Box::new(error)))?;
        let browser = Self {
            client,
            _driver: driver,
            _profile: profile,
            timeout: options.timeout,
        };
        let (width, height) = options.viewport;
        browser.set_viewport_size(width, height).await?;
        Ok(browser)
    }

    /// Loads `url` and returns once it has loaded (its `load` event), waiting at most the
    /// [timeout](BrowserOptions::timeout).
    ///
    /// # Errors
    ///
    /// [`Error::Command`] when the page does not load in time or cannot be reached.
    pub async fn goto(&self, url: &str) -> Result<()> {
        Ok(self.client.goto(url).await?)
    }

    /// The URL of the current page, after any redirect.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] when the browser does not answer.
    pub async fn current_url(&self) -> Result<String> {
        Ok(self.client.current_url().await?.into())
    }

    /// The current page's title.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] when the browser does not answer.
    pub async fn title(&self) -> Result<String> {
        Ok(self.client.title().await?)
    }

    /// Whether an element matches `selector`, without waiting for one.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] when the selector is not valid CSS.
    pub async fn exists(&self, selector: &str) -> Result<bool> {
        let found = self.client.find_all(Locator::Css(selector)).await;
        Ok(!found
            .map_err(|error| Error::on(selector, error))?
            .is_empty())
    }

    /// Waits until an element matches `selector`, at most the
    /// [timeout](BrowserOptions::timeout): for what a page's script adds.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when none did in time.
    pub async fn wait_for(&self, selector: &str) -> Result<()> {
        let found = self
            .client
            .wait()
            .at_most(self.timeout)
            .for_element(Locator::Css(selector))
            .await;
        match found {
            Ok(_) => Ok(()),
            Err(CmdError::WaitTimeout) => Err(Error::Timeout {
                selector: selector.to_owned(),
                waited: self.timeout,
            }),
            Err(error) => Err(Error::on(selector, error)),
        }
    }

    /// The text of the element `selector` matches as the page shows it: its visible
    /// text, laid out (`innerText`), markup in it shown as characters.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchElement`] when nothing matches.
    pub async fn text(&self, selector: &str) -> Result<String> {
        self.find(selector, |element| async move { element.text().await })
            .await
    }

    /// The texts of every element `selector` matches, in document order (rows of a
    /// table, say); empty when none does.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] when the browser does not answer.
    pub async fn texts(&self, selector: &str) -> Result<Vec<String>> {
        let on = |error| Error::on(selector, error);
        let elements = self
            .client
            .find_all(Locator::Css(selector))
            .await
            .map_err(on)?;
        let mut texts = Vec::with_capacity(elements.len());
        for element in elements {
            texts.push(element.text().await.map_err(on)?);
        }
        Ok(texts)
    }

    /// The attribute `name` of the element `selector` matches, as written in the page
    /// (`href="/next"` gives `/next`); `None` when the element has no such attribute.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchElement`] when nothing matches.
    pub async fn attribute(&self, selector: &str, name: &str) -> Result<Option<String>> {
        self.find(selector, |element| async move { element.attr(name).await })
            .await
    }

    /// Types `value` into the field `selector` matches, replacing what it held.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchElement`] when nothing matches; [`Error::Command`] when the element
    /// takes no input (hidden, disabled, not a field).
    pub async fn fill(&self, selector: &str, value: &str) -> Result<()> {
        self.find(selector, |element| async move {
            element.clear().await?;
            element.send_keys(value).await
        })
        .await
    }

    /// Clicks the element `selector` matches, as a person would (it must be visible and
    /// not covered), and returns once a navigation the click started has loaded.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchElement`] when nothing matches; [`Error::Command`] when it cannot
    /// be clicked.
    pub async fn click(&self, selector: &str) -> Result<()> {
        self.find(selector, |element| async move { element.click().await })
            .await
    }

    /// Submits the form `selector` matches by clicking its first submit button (a
    /// `<button>` without a type or of type `submit`, an `<input type=submit>` or
    /// `type=image`), so its validation and `submit` handlers run; returns once the
    /// page it leads to has loaded.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchElement`] when no form matches, or the form has no submit button.
    pub async fn submit(&self, selector: &str) -> Result<()> {
        let form = self
            .client
            .find(Locator::Css(selector))
            .await
            .map_err(|error| Error::on(selector, error))?;
        let button = form
            .find(Locator::Css(SUBMIT_BUTTON))
            .await
            .map_err(|error| Error::on(&format!("{selector} :is({SUBMIT_BUTTON})"), error))?;
        button.click().await?;
        // The click returns once the submission is under way, not always once it is
        // over: wait until the form's page is gone (its element goes stale) and the
        // next one has loaded, for at most the browser's timeout.
        let deadline = tokio::time::Instant::now() + self.timeout;
        while form.tag_name().await.is_ok() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        while tokio::time::Instant::now() < deadline {
            let state = self
                .client
                .execute("return document.readyState", Vec::new())
                .await?;
            if state == "complete" {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// The cookies the browser sends to the current page, with their attributes
    /// (`HttpOnly`, `Secure`, `SameSite`), which the page's scripts cannot see.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] when the browser does not answer.
    pub async fn cookies(&self) -> Result<Vec<Cookie>> {
        let cookies = self.client.get_all_cookies().await?;
        Ok(cookies.iter().map(Cookie::from_webdriver).collect())
    }

    /// The cookie `name` the browser sends to the current page, if it holds one.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] when the browser does not answer.
    pub async fn cookie(&self, name: &str) -> Result<Option<Cookie>> {
        let cookies = self.cookies().await?;
        Ok(cookies.into_iter().find(|cookie| cookie.name == name))
    }

    /// Resizes the window so that the page is shown on `width` × `height` CSS pixels,
    /// the size of the next screenshots.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] when the browser refuses the size.
    pub async fn set_viewport_size(&self, width: u32, height: u32) -> Result<()> {
        // The window's size counts what a headless window still draws around the page:
        // resize once, measure that frame, resize by it.
        self.client.set_window_size(width, height).await?;
        let (shown_width, shown_height) = self.viewport_size().await?;
        if (shown_width, shown_height) != (width, height) {
            let frame_width = width.saturating_sub(shown_width);
            let frame_height = height.saturating_sub(shown_height);
            self.client
                .set_window_size(width + frame_width, height + frame_height)
                .await?;
        }
        Ok(())
    }

    /// The size, in CSS pixels, of the area the page is shown on.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] when the browser does not answer.
    pub async fn viewport_size(&self) -> Result<(u32, u32)> {
        let size = self
            .client
            .execute("return [window.innerWidth, window.innerHeight]", Vec::new())
            .await?;
        let side = |index: usize| {
            size.get(index)
                .and_then(Value::as_u64)
                .and_then(|pixels| u32::try_from(pixels).ok())
                .ok_or_else(|| CmdError::NotW3C(size.clone()))
        };
        Ok((side(0)?, side(1)?))
    }

    /// Writes a PNG of the viewport to `path`, making its directories.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] when the browser takes none; [`Error::Screenshot`] when the
    /// file cannot be written.
    pub async fn screenshot(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let png = self.client.screenshot().await?;
        let write = || {
            if let Some(directory) = path.parent() {
                std::fs::create_dir_all(directory)?;
            }
            std::fs::write(path, png)
        };
        write().map_err(|source| Error::Screenshot {
            path: path.to_owned(),
            source,
        })
    }

    /// The WebDriver client, for what the methods above do not cover (scripts, keys,
    /// frames, alerts).
    pub fn webdriver(&self) -> &Client {
        &self.client
    }

    /// Ends the session, which closes Chromium, then stops chromedriver and removes the
    /// profile.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] when the session could not be ended; the processes are killed
    /// all the same.
    pub async fn close(self) -> Result<()> {
        Ok(self.client.clone().close().await?)
    }

    /// Runs `action` on the element `selector` matches.
    async fn find<T, F, Fut>(&self, selector: &str, action: F) -> Result<T>
    where
        F: FnOnce(Element) -> Fut,
        Fut: Future<Output = Result<T, CmdError>>,
    {
        let on = |error| Error::on(selector, error);
        let element = self.client.find(Locator::Css(selector)).await.map_err(on)?;
        action(element).await.map_err(on)
    }
}

/// The session chromedriver is asked for: Chromium headless and quiet on a fresh
/// profile, its window about the options' size, pages given the options' timeout to load.
fn capabilities(options: &BrowserOptions, profile: &Path) -> Capabilities {
    let (width, height) = options.viewport;
    let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|&arg| arg.to_owned()).collect();
    args.push(format!("--user-data-dir={}", profile.display()));
    args.push(format!("--window-size={width},{height}"));
    let mut chromium = json!({ "args": args });
    if let Some(binary) = &options.chromium {
        chromium["binary"] = Value::from(binary.to_string_lossy());
    }
    let timeout = u64::try_from(options.timeout.as_millis()).unwrap_or(u64::MAX);
    let mut capabilities = Capabilities::new();
    capabilities.insert("browserName".to_owned(), json!("chrome"));
    capabilities.insert("goog:chromeOptions".to_owned(), chromium);
    capabilities.insert(
        "timeouts".to_owned(),
        json!({ "pageLoad": timeout, "script": timeout }),
    );
    capabilities
}
