//! What can go wrong starting or driving a [`Browser`](super::Browser).

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use fantoccini::error::{CmdError, NewSessionError};

/// `Result` with the browser's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong starting or driving a [`Browser`](super::Browser).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The chromedriver program is not there: the browser is not installed.
    #[error(
        "chromedriver is not installed (no program `{}`): install Chromium and its driver, \
         on Debian `apt-get install chromium chromium-driver`, or run \
         `scripts/services.sh browser` in the oncebox repository",
        program.display()
    )]
    NotInstalled {
        /// The program that was looked for.
        program: PathBuf,
    },

    /// chromedriver could not be started, or its profile directory not made.
    #[error("could not start chromedriver: {0}")]
    Start(#[source] io::Error),

    /// chromedriver exited before it listened.
    #[error("chromedriver exited before it listened: {status}")]
    Exited {
        /// How it exited.
        status: ExitStatus,
    },

    /// chromedriver did not listen within the [timeout](super::BrowserOptions::timeout).
    #[error("chromedriver did not listen on port {port} within {waited:?}")]
    NotListening {
        /// The port it was told to listen on.
        port: u16,
        /// How long it was waited for.
        waited: Duration,
    },

    /// chromedriver did not start a browser session (Chromium is missing or crashed).
    #[error("chromedriver did not start Chromium: {0}")]
    Session(#[source] Box<NewSessionError>),

    /// No element of the page matches the selector.
    #[error("no element matches `{selector}`")]
    NoSuchElement {
        /// The CSS selector.
        selector: String,
    },

    /// No element matched the selector within the [timeout](super::BrowserOptions::timeout).
    #[error("no element matched `{selector}` within {waited:?}")]
    Timeout {
        /// The CSS selector.
        selector: String,
        /// How long it was waited for.
        waited: Duration,
    },

    /// A WebDriver command failed: the page did not load, the element could not be
    /// clicked, the session is gone...
    #[error("webdriver command failed: {0}")]
    Command(#[source] Box<CmdError>),

    /// A screenshot could not be written.
    #[error("could not write the screenshot {}: {source}", path.display())]
    Screenshot {
        /// Where it was to be written.
        path: PathBuf,
        /// What the file system reported.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Whether the browser is not installed: the test cannot run on this machine as it is.
    pub fn is_not_installed(&self) -> bool {
        matches!(self, Self::NotInstalled { .. })
    }

    /// The error of a command on the element(s) `selector` matches.
    pub(super) fn on(selector: &str, error: CmdError) -> Self {
        if error.is_no_such_element() {
            Self::NoSuchElement {
                selector: selector.to_owned(),
            }
        } else {
            Self::Command(Box::new(error))
        }
    }
}

impl From<CmdError> for Error {
    fn from(error: CmdError) -> Self {
        Self::Command(Box::new(error))
    }
}
