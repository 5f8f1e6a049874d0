//! The dashboard's failure groups over HTTP (no browser): `oncebox dashboard` over a
//! seeded PostgreSQL outbox, its pages read and its forms sent back as a browser would.
//! A group's topic is data, found again exactly: an empty topic, or one with outer
//! spaces (`" orders "`), is its own group, apart from `"orders"` and `" "`, and a
//! replay or purge of the group changes exactly its letters.

mod support;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use support::{Service, psql, run_ok, wait_for, write_config};

const TOKEN: &str = "a-dashboard-token-for-tests";
const BASE: &str = "/ops";

/// Every dead letter fails alike: one signature, so the topic alone parts the groups.
const REASON: &str = "publish failed: broker refused message";

/// Dead letters seeded: (id, topic).
const LETTERS: [(&str, &str); 7] = [
    ("0193a1b2-0000-7000-8000-0000000000e1", ""),
    ("0193a1b2-0000-7000-8000-0000000000e2", ""),
    ("0193a1b2-0000-7000-8000-0000000000a1", " orders "),
    ("0193a1b2-0000-7000-8000-0000000000a2", " orders "),
    ("0193a1b2-0000-7000-8000-0000000000b1", "orders"),
    ("0193a1b2-0000-7000-8000-0000000000c1", " "),
    ("0193a1b2-0000-7000-8000-0000000000d1", "orders "),
];

#[test]
fn groups_with_an_empty_or_spaced_topic_are_replayed_and_purged_exactly() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("dashboard_groups");
    let port = support::free_port();
    let config = write_config(
        dir.path(),
        "dashboard.toml",
        &format!(
            "[store]\nurl = \"{pg}\"\nschema = \"{schema}\"\n\n\
             [dashboard]\nlisten = \"127.0.0.1:{port}\"\nbase_path = \"{BASE}\"\n\
             token = \"{TOKEN}\"\nread_only = false\n",
            pg = support::pg_url(),
        ),
    );
    run_ok(&config, &["migrate"]);
    seed(&schema);
    let mut dashboard = Service::start(dir.path(), "dashboard", &config, &["dashboard"]);
    wait_for("the dashboard answers", Duration::from_secs(30), || {
        support::http_get(port, "/ops/login").filter(|(status, _)| *status == 200)
    });
    let site = Site::login(port);

    // The failures page lists one group a topic, each linking to its own page.
    let (status, page) = site.get("/ops/failures");
    assert_eq!(status, 200, "{page}");
    let links = group_links(&page);
    let topics: Vec<&str> = links.iter().map(|(topic, _)| topic.as_str()).collect();
    for (_, topic) in LETTERS {
        assert_eq!(
            topics.iter().filter(|found| **found == topic).count(),
            1,
            "one group of {topic:?}: {topics:?}"
        );
    }

    // The empty topic's group: its page, then a replay of exactly its two letters.
    let replayed = site.apply_group(&links, "", "replay-group", 2);
    assert!(replayed.contains("Replayed 2 of 2"), "{replayed}");
    // The spaced topic's group: a purge of exactly its two letters.
    let purged = site.apply_group(&links, " orders ", "purge-group", 2);
    assert!(purged.contains("Purged 2 of 2"), "{purged}");

    for (id, topic) in LETTERS {
        let expected = match topic {
            "" => "pending",
            " orders " => "",
            _ => "dead",
        };
        assert_eq!(
            psql(&format!(
                "SELECT status FROM {schema}.outbox WHERE id = '{id}'"
            )),
            expected,
            "the letter {id} of {topic:?}"
        );
    }
    dashboard.stop_cleanly(Duration::from_secs(10));
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// The dead letters of [`LETTERS`], as a service in another language would write them.
fn seed(schema: &str) {
    let rows: Vec<String> = LETTERS
        .iter()
        .enumerate()
        .map(|(n, (id, topic))| {
            format!(
                "('{id}', '{topic}', 'k', 'Kind', '{{}}', '', 'dead', 10, '{REASON} {n}', now())"
            )
        })
        .collect();
    psql(&format!(
        "INSERT INTO {schema}.outbox
                (id, topic, key, kind, headers, payload, status, attempts, last_error, dead_at)
         VALUES {}",
        rows.join(", ")
    ));
}

/// A logged-in operator: the session cookie and its CSRF token.
struct Site {
    port: u16,
    cookie: String,
    csrf: String,
}

impl Site {
    fn login(port: u16) -> Self {
        let (status, head, _) =
            request(port, "POST", "/ops/login", None, &format!("token={TOKEN}"));
        assert_eq!(status, 303, "the login redirects: {head}");
        let cookie = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("set-cookie")
                    .then(|| value.trim().split(';').next().unwrap_or("").to_owned())
            })
            .expect("a session cookie");
        let mut site = Self {
            port,
            cookie,
            csrf: String::new(),
        };
        let (_, overview) = site.get("/ops/");
        site.csrf = hidden_fields(&overview)
            .into_iter()
            .find_map(|(name, value)| (name == "csrf").then_some(value))
            .expect("the logout form carries the CSRF token");
        site
    }

    fn get(&self, path: &str) -> (u16, String) {
        let (status, _, body) = request(self.port, "GET", path, Some(&self.cookie), "");
        (status, body)
    }

    fn post(&self, path: &str, fields: &[(String, String)]) -> (u16, String) {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        let (status, _, body) = request(self.port, "POST", path, Some(&self.cookie), &body);
        (status, body)
    }

    /// Opens the group of `topic` from its link, sends its `action` form, confirms, and
    /// returns the outcome page; checks that the group and the confirmation name
    /// `count` letters.
    fn apply_group(
        &self,
        links: &[(String, String)],
        topic: &str,
        action: &str,
        count: usize,
    ) -> String {
        let (_, link) = links
            .iter()
            .find(|(found, _)| found == topic)
            .unwrap_or_else(|| panic!("no group of {topic:?} among {links:?}"));
        let (status, page) = self.get(link);
        assert_eq!(status, 200, "the group of {topic:?}: {page}");
        assert_eq!(
            page.matches("type=\"checkbox\"").count(),
            count,
            "the group of {topic:?} lists its letters: {page}"
        );
        let mut fields = form_fields(&page, "/ops/actions/confirm");
        assert!(
            fields
                .iter()
                .any(|(name, value)| name == "topic" && value == topic),
            "the form carries the topic as it is: {fields:?}"
        );
        fields.push(("action".to_owned(), action.to_owned()));
        let (status, confirmation) = self.post("/ops/actions/confirm", &fields);
        assert_eq!(status, 200, "{confirmation}");
        assert!(
            confirmation.contains(&format!(" {count} dead letters?")),
            "the confirmation names {count}: {confirmation}"
        );
        let fields = form_fields(&confirmation, "/ops/actions/apply");
        let (status, outcome) = self.post("/ops/actions/apply", &fields);
        assert_eq!(status, 200, "{outcome}");
        outcome
    }
}

/// The failures page's links to groups: (topic, path and query), the topic decoded.
fn group_links(page: &str) -> Vec<(String, String)> {
    let links = regex::Regex::new(r#"href="(/ops/failures/group\?[^"]*)""#).expect("a pattern");
    links
        .captures_iter(page)
        .map(|found| {
            let link = unescape(&found[1]);
            let query = link.split_once('?').map_or("", |(_, query)| query);
            let topic = url::form_urlencoded::parse(query.as_bytes())
                .find(|(name, _)| name == "topic")
                .map(|(_, value)| value.into_owned())
                .expect("a topic in the link");
            (topic, link)
        })
        .collect()
}

/// The hidden fields of the form posting to `action` on `page`, as a browser sends them.
fn form_fields(page: &str, action: &str) -> Vec<(String, String)> {
    let start = page
        .find(&format!("action=\"{action}\""))
        .unwrap_or_else(|| panic!("a form posting to {action}: {page}"));
    let form = &page[start..];
    let form = &form[..form.find("</form>").unwrap_or(form.len())];
    hidden_fields(form)
}

/// Every `<input type="hidden" name=… value=…>` of `html`, values unescaped.
fn hidden_fields(html: &str) -> Vec<(String, String)> {
    let input = regex::Regex::new(r#"<input type="hidden" name="([^"]*)" value="([^"]*)""#)
        .expect("a pattern");
    input
        .captures_iter(html)
        .map(|found| (unescape(&found[1]), unescape(&found[2])))
        .collect()
}

/// Undoes maud's escaping of attribute values.
fn unescape(text: &str) -> String {
    text.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// `METHOD path` with a form `body` and a cookie: the status, the head, the body.
fn request(
    port: u16,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("the dashboard answers");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a timeout");
    let cookie = cookie
        .map(|cookie| format!("Cookie: {cookie}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{cookie}\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("sent");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("an answer");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .expect("a status line");
    (status, head.to_owned(), body.to_owned())
}
