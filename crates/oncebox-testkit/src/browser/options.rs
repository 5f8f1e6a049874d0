//! How a [`Browser`](super::Browser) is started.

use std::path::PathBuf;
use std::time::Duration;

/// Where chromedriver and Chromium are, the size of the page's area and how long to wait.
///
/// ```
/// use std::time::Duration;
/// use oncebox_testkit::browser::BrowserOptions;
///
/// let options = BrowserOptions::new()
///     .viewport_size(1024, 768)
///     .timeout(Duration::from_secs(20));
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct BrowserOptions {
    pub(super) chromedriver: PathBuf,
    pub(super) chromium: Option<PathBuf>,
    pub(super) viewport: (u32, u32),
    pub(super) timeout: Duration,
}

impl BrowserOptions {
    /// The defaults, listed with each setter.
    pub fn new() -> Self {
        Self {
            chromedriver: PathBuf::from("chromedriver"),
            chromium: None,
            viewport: (1280, 800),
            timeout: Duration::from_secs(10),
        }
    }

    /// The chromedriver program: a path, or a name looked up in `PATH`.
    /// Default: `chromedriver`.
    pub fn chromedriver(mut self, program: impl Into<PathBuf>) -> Self {
        self.chromedriver = program.into();
        self
    }

    /// The Chromium (or Chrome) binary chromedriver starts. Default: the one chromedriver
    /// finds itself (Debian's `chromium` for Debian's `chromium-driver`).
    pub fn chromium(mut self, binary: impl Into<PathBuf>) -> Self {
        self.chromium = Some(binary.into());
        self
    }

    /// The size in CSS pixels of the area the page is shown on (the viewport), which is
    /// the size of every screenshot; the window around it is sized to fit. Default:
    /// 1280 × 800.
    pub fn viewport_size(mut self, width: u32, height: u32) -> Self {
        self.viewport = (width, height);
        self
    }

    /// How long chromedriver may take to listen, a page to load and
    /// [`wait_for`](super::Browser::wait_for) an element to appear. Default: 10 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl Default for BrowserOptions {
    fn default() -> Self {
        Self::new()
    }
}
