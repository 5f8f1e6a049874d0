//! The dashboard in a real browser (Debian's chromium, through chromedriver): served by
//! `oncebox relay` over a seeded PostgreSQL outbox, under a base path; a login with the
//! token; the overview's numbers; a filter by key; a message whose payload holds a
//! `<script>`; a failure group replayed and published by the running relay; refusals of
//! a wrong token, a missing CSRF token and any change in read-only mode.
//!
//! Screenshots of each page are taken on every run; with `ONCEBOX_UPDATE_SCREENSHOTS=1`
//! they replace those in `docs/dashboard/` that the README shows.

mod support;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use oncebox::redis::{RedisDedupStore, redis};
use oncebox::store::{Begin, DedupStore};
use oncebox_testkit::browser::{Browser, BrowserOptions, SameSite};
use support::{Service, psql, run_ok, wait_for, write_config};

const TOKEN: &str = "a-dashboard-token-for-tests";
const BASE: &str = "/ops";

/// Dead letters on `payments` that failed alike, and one on `alerts` whose payload is
/// markup.
const PAYMENT_A: &str = "0193a1b2-0000-7000-8000-00000000000a";
const PAYMENT_B: &str = "0193a1b2-0000-7000-8000-00000000000b";
const SCRIPTED: &str = "0193a1b2-0000-7000-8000-0000000000cc";
const SCRIPT: &str = "<script>document.title = 'owned'</script>";

/// Published rows seeded: 80 a customer, so a customer's rows fill two pages.
const PUBLISHED: usize = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_and_repair_the_outbox_in_a_browser() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("dashboard");
    let shots = screenshots(dir.path());
    let port = support::free_port();
    let config = dashboard_config(dir.path(), "relay.toml", &schema, port, false);
    run_ok(&config, &["migrate"]);
    seed(&schema);

    let mut relay = Service::start(dir.path(), "relay", &config, &["relay"]);
    relay.wait_ready(Duration::from_secs(30));
    let site = format!("http://127.0.0.1:{port}{BASE}");
    let browser = Browser::launch(BrowserOptions::new().viewport_size(1280, 800))
        .await
        .expect("chromium starts (scripts/services.sh browser installs it)");

    // Every page sends a stranger to the login; a wrong token is refused.
    browser
        .goto(&format!("{site}/messages"))
        .await
        .expect("loads");
    assert!(
        browser
            .current_url()
            .await
            .expect("a url")
            .ends_with("/ops/login"),
        "not logged in: the login page"
    );
    browser
        .fill("#token", "not-the-token-at-all")
        .await
        .expect("typed");
    browser.submit("form.login").await.expect("submitted");
    browser.wait_for(".problem").await.expect("the refusal");
    assert!(
        browser
            .text(".problem")
            .await
            .expect("a problem shown")
            .contains("not the dashboard's"),
        "a wrong token is refused"
    );
    assert!(
        browser
            .cookie("oncebox_session")
            .await
            .expect("cookies")
            .is_none()
    );
    assert_eq!(post(port, "/ops/login", None, "token=wrong").0, 401);

    // The token opens a session: an HttpOnly, SameSite=Strict cookie under the base path.
    browser.fill("#token", TOKEN).await.expect("typed");
    browser.submit("form.login").await.expect("submitted");
    browser.wait_for("#pending").await.expect("the overview");
    let cookie = browser
        .cookie("oncebox_session")
        .await
        .expect("cookies")
        .expect("a session cookie");
    assert!(cookie.http_only, "{cookie:?}");
    assert_eq!(cookie.same_site, Some(SameSite::Strict), "{cookie:?}");
    assert_eq!(cookie.path.as_deref(), Some("/ops/"), "{cookie:?}");

    // The overview counts the seeded outbox: the 5 rows due tomorrow, never attempted,
    // are scheduled messages, not pending ones.
    browser.goto(&format!("{site}/")).await.expect("loads");
    assert_eq!(browser.text("#pending").await.expect("pending"), "0");
    assert_eq!(browser.text("#scheduled").await.expect("scheduled"), "5");
    assert_eq!(
        browser.text("#published").await.expect("published"),
        PUBLISHED.to_string()
    );
    assert_eq!(browser.text("#dead").await.expect("dead"), "3");
    assert!(
        browser
            .text("figcaption")
            .await
            .expect("a chart")
            .starts_with(&format!("{PUBLISHED} published")),
        "the chart counts the hour's publications"
    );
    let consumers = browser
        .texts("table.consumers tbody tr")
        .await
        .expect("consumers");
    assert_eq!(consumers.len(), 2, "{consumers:?}");
    let figures = |row: &str| row.split_whitespace().take(5).collect::<Vec<_>>().join(" ");
    assert_eq!(figures(&consumers[0]), "billing 12 4 0 0", "{consumers:?}");
    assert_eq!(figures(&consumers[1]), "shipping 1 0 1 1", "{consumers:?}");
    browser
        .screenshot(shots.join("overview.png"))
        .await
        .expect("a screenshot");

    // An idempotency key looked up in the store's dedup records.
    browser
        .goto(&format!("{site}/keys?id=payment-42"))
        .await
        .expect("loads");
    assert_eq!(
        browser.text("#key-state").await.expect("a state"),
        "completed"
    );
    assert!(
        browser
            .text("#key-result")
            .await
            .expect("a result")
            .contains("\"charged\": 4200"),
        "the stored result, pretty-printed"
    );
    browser
        .screenshot(shots.join("keys.png"))
        .await
        .expect("a screenshot");
    assert_eq!(
        browser.text("#redis-key-state").await.expect("a state"),
        "No record of payment-42: never seen, or expired.",
        "Redis is looked up too, and holds no such record"
    );

    // A record of an idempotent receiver on Redis, found there and not in the store.
    let redis_dedup = RedisDedupStore::connect(&support::redis_url())
        .await
        .expect("Redis answers")
        .with_prefix(format!("{schema}:dedup"));
    let Begin::Started(token) = redis_dedup
        .begin("order-7", Duration::from_secs(30))
        .await
        .expect("begin")
    else {
        panic!("a fresh id starts");
    };
    redis_dedup
        .complete(
            "order-7",
            token,
            br#"{"shipped": 7}"#,
            Duration::from_secs(600),
        )
        .await
        .expect("complete");
    browser
        .goto(&format!("{site}/keys?id=order-7"))
        .await
        .expect("loads");
    assert_eq!(
        browser.text("#redis-key-state").await.expect("a state"),
        "completed"
    );
    assert!(
        browser
            .text("#redis-key-result")
            .await
            .expect("a result")
            .contains("\"shipped\": 7"),
        "the result stored in Redis, pretty-printed"
    );
    assert!(
        browser
            .text("#key-state")
            .await
            .expect("a state")
            .starts_with("No record"),
        "the store has no record of it"
    );
    browser
        .goto(&format!("{site}/keys?id=never-seen"))
        .await
        .expect("loads");
    assert!(
        browser
            .text("#key-state")
            .await
            .expect("a state")
            .starts_with("No record")
    );

    // The durable inbox: every consumer's rows newest first, filtered by status, and one
    // row with its error, or its handler's result.
    browser.goto(&format!("{site}/inbox")).await.expect("loads");
    let rows = browser
        .texts("table.inbox tbody tr")
        .await
        .expect("inbox rows");
    let ids: Vec<&str> = rows
        .iter()
        .map(|row| row.split_whitespace().nth(2).unwrap_or_default())
        .collect();
    assert_eq!(ids, ["d-3", "d-2", "d-1"], "{rows:?}");
    browser
        .screenshot(shots.join("inbox.png"))
        .await
        .expect("a screenshot");
    browser
        .goto(&format!("{site}/inbox?consumer=shipping&status=dead"))
        .await
        .expect("loads");
    let rows = browser
        .texts("table.inbox tbody tr")
        .await
        .expect("inbox rows");
    assert_eq!(rows.len(), 1, "{rows:?}");
    browser
        .click("table.inbox tbody a")
        .await
        .expect("opens the row");
    browser.wait_for("#dedup-id").await.expect("the row's page");
    assert_eq!(browser.text("#dedup-id").await.expect("the id"), "d-3");
    assert_eq!(
        browser.text("#last-error").await.expect("the error"),
        "handler failed"
    );
    browser
        .goto(&format!("{site}/inbox?id=d-1"))
        .await
        .expect("loads");
    browser
        .click("table.inbox tbody a")
        .await
        .expect("opens the row");
    browser.wait_for("#result").await.expect("the row's page");
    assert!(
        browser
            .text("#result")
            .await
            .expect("the result")
            .contains("\"shipped\": true"),
        "the handler's result, pretty-printed"
    );
    browser
        .goto(&format!("{site}/inbox?status=done"))
        .await
        .expect("loads");
    assert!(
        browser
            .text("main")
            .await
            .expect("the page")
            .contains("is not a status"),
        "a bad filter is named"
    );

    // Filtered by key: only that key's rows, newest first, over two pages.
    browser
        .goto(&format!("{site}/messages"))
        .await
        .expect("loads");
    browser
        .fill("input[name=key]", "customer-3")
        .await
        .expect("typed");
    browser.submit("form.filters").await.expect("filtered");
    // The filtered page writes the key into its form (a typed value is no attribute).
    browser
        .wait_for("input[name=key][value=customer-3]")
        .await
        .expect("the filtered page");
    let first = page_of(&browser, "customer-3").await;
    assert_eq!(first.len(), 50, "a full page: {first:?}");
    browser
        .screenshot(shots.join("messages.png"))
        .await
        .expect("a screenshot");
    browser.click("#older").await.expect("the next page");
    browser
        .wait_for("a[href$='/messages?key=customer-3']")
        .await
        .expect("the second page");
    let second = page_of(&browser, "customer-3").await;
    assert_eq!(second.len(), 30, "the rest: {second:?}");
    assert!(
        second[0] < first[49],
        "older rows: {first:?} then {second:?}"
    );
    assert!(
        !browser.exists("#older").await.expect("a query"),
        "the last page"
    );

    // A payload holding markup is shown as text: no script element, the title intact.
    browser
        .goto(&format!("{site}/messages/{SCRIPTED}"))
        .await
        .expect("loads");
    assert_eq!(browser.text("#payload").await.expect("the payload"), SCRIPT);
    assert!(
        !browser.exists("main script").await.expect("a query"),
        "no script element"
    );
    assert_eq!(browser.title().await.expect("a title"), "Message · oncebox");
    assert!(
        browser
            .text("#last-error")
            .await
            .expect("the error")
            .contains("<b>refused</b>"),
        "the error is text too"
    );
    browser
        .screenshot(shots.join("message.png"))
        .await
        .expect("a screenshot");

    // A form without the session's CSRF token changes nothing.
    let session = format!("oncebox_session={}", cookie.value);
    let body = format!("action=purge&id={SCRIPTED}");
    assert_eq!(
        post(port, "/ops/actions/apply", Some(&session), &body).0,
        403
    );
    let forged = format!("{body}&csrf=0123456789abcdef");
    assert_eq!(
        post(port, "/ops/actions/apply", Some(&session), &forged).0,
        403
    );
    assert_eq!(status_of(&schema, SCRIPTED), "dead", "nothing was purged");

    // The failures, grouped: the two payment failures are one group, replayed together
    // after a confirmation naming how many, then published by the running relay.
    browser
        .goto(&format!("{site}/failures"))
        .await
        .expect("loads");
    let groups = browser
        .texts("table.groups tbody tr")
        .await
        .expect("groups");
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert!(
        groups[0].contains("payments")
            && groups[0].contains("publish failed: broker refused message #"),
        "the larger group first, its ids and numbers generalised: {groups:?}"
    );
    browser
        .screenshot(shots.join("failures.png"))
        .await
        .expect("a screenshot");
    browser
        .click("table.groups tbody tr:first-child a")
        .await
        .expect("opened");
    browser
        .wait_for("button[value=replay-group]")
        .await
        .expect("the group");
    browser
        .click("button[value=replay-group]")
        .await
        .expect("asked");
    browser
        .wait_for("#confirm")
        .await
        .expect("the confirmation");
    assert_eq!(
        browser.text("h1").await.expect("a question"),
        "Replay 2 dead letters?"
    );
    browser
        .screenshot(shots.join("confirm.png"))
        .await
        .expect("a screenshot");
    // An older row of the group dies while the operator reads the confirmation: the
    // change must not take a letter that was not confirmed.
    psql(&format!(
        "UPDATE {schema}.outbox
         SET topic = 'payments', status = 'dead', attempts = 10, dead_at = now(),
             last_error = 'publish failed: broker refused message 1203'
         WHERE seq = (SELECT min(seq) FROM {schema}.outbox WHERE key = 'later')"
    ));
    browser.click("#confirm").await.expect("confirmed");
    browser.wait_for("#outcome").await.expect("the outcome");
    assert_eq!(
        browser.text("#outcome").await.expect("an outcome"),
        "The group changed: nothing was done"
    );
    assert_eq!(
        status_of(&schema, PAYMENT_A),
        "dead",
        "nothing was replayed"
    );
    browser.click("main a").await.expect("back to the group");
    browser
        .wait_for("button[value=replay-group]")
        .await
        .expect("the group");
    browser
        .click("button[value=replay-group]")
        .await
        .expect("asked again");
    browser
        .wait_for("#confirm")
        .await
        .expect("the confirmation");
    assert_eq!(
        browser.text("h1").await.expect("a question"),
        "Replay 3 dead letters?"
    );
    browser.click("#confirm").await.expect("confirmed");
    browser.wait_for("#outcome").await.expect("the outcome");
    assert_eq!(
        browser.text("#outcome").await.expect("an outcome"),
        "Replayed 3 of 3"
    );
    for id in [PAYMENT_A, PAYMENT_B] {
        wait_for(
            "the relay published the replayed letter",
            Duration::from_secs(30),
            || (status_of(&schema, id) == "done").then_some(()),
        );
    }
    browser
        .goto(&format!("{site}/messages/{PAYMENT_A}"))
        .await
        .expect("loads");
    assert_eq!(
        browser.text(".facts .badge").await.expect("a status"),
        "published"
    );
    wait_for(
        "the relay published the third replayed letter",
        Duration::from_secs(30),
        || {
            let pending = psql(&format!(
                "SELECT count(*) FROM {schema}.outbox WHERE status = 'pending'"
            ));
            (pending == "4").then_some(())
        },
    );
    let published = published_on_redis(&schema).await;
    assert_eq!(
        published, 3,
        "the three replayed letters reached the stream"
    );

    // Read-only: the same letter offers no action, and a change with a valid CSRF token
    // is refused.
    let read_only_port = support::free_port();
    let read_only = dashboard_config(dir.path(), "read-only.toml", &schema, read_only_port, true);
    let mut dashboard = Service::start(dir.path(), "dashboard", &read_only, &["dashboard"]);
    let read_only_site = format!("http://127.0.0.1:{read_only_port}{BASE}");
    wait_for("the dashboard answers", Duration::from_secs(30), || {
        support::http_get(read_only_port, "/ops/login").filter(|(status, _)| *status == 200)
    });
    browser
        .goto(&format!("{read_only_site}/login"))
        .await
        .expect("loads");
    browser.fill("#token", TOKEN).await.expect("typed");
    browser.submit("form.login").await.expect("submitted");
    browser.wait_for("#pending").await.expect("the overview");
    browser
        .goto(&format!("{read_only_site}/messages/{SCRIPTED}"))
        .await
        .expect("loads");
    assert!(browser.exists(".badge.read-only").await.expect("a query"));
    assert!(
        !browser.exists("form.actions").await.expect("a query"),
        "no action shown"
    );
    browser.goto(&format!("{read_only_site}/failures/group?topic=alerts&signature=publish+failed%3A+%3Cb%3Erefused%3C%2Fb%3E")).await.expect("loads");
    assert!(
        !browser
            .exists("input[type=checkbox]")
            .await
            .expect("a query")
    );
    let csrf = browser
        .attribute("input[name=csrf]", "value")
        .await
        .expect("the logout form")
        .expect("a CSRF token");
    let session = browser
        .cookie("oncebox_session")
        .await
        .expect("cookies")
        .expect("a session");
    let session = format!("oncebox_session={}", session.value);
    let body = format!("action=purge&id={SCRIPTED}&csrf={csrf}");
    let (status, page) = post(read_only_port, "/ops/actions/apply", Some(&session), &body);
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("read-only"), "{page}");
    assert_eq!(status_of(&schema, SCRIPTED), "dead");

    browser.close().await.expect("the browser closes");
    dashboard.stop_cleanly(Duration::from_secs(10));
    relay.stop_cleanly(Duration::from_secs(10));
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

fn dashboard_config(dir: &Path, name: &str, schema: &str, port: u16, read_only: bool) -> PathBuf {
    write_config(
        dir,
        name,
        &format!(
            r#"
[store]
url = "{pg}"
schema = "{schema}"

[broker]
url = "{redis}"
key_prefix = "{schema}:"

[dashboard]
listen = "127.0.0.1:{port}"
base_path = "{BASE}"
token = "{TOKEN}"
read_only = {read_only}
redis_dedup_url = "{redis}"
redis_dedup_prefix = "{schema}:dedup"
"#,
            pg = support::pg_url(),
            redis = support::redis_url(),
        ),
    )
}

/// Published rows of 5 customers over the last hour, more of them lately; 5 pending rows
/// scheduled for tomorrow; three dead letters; two inbox consumers' records and a completed dedup
/// record; inserted as a service in another language would.
fn seed(schema: &str) {
    psql(&format!(
        "INSERT INTO {schema}.outbox (id, topic, key, kind, payload, status, created_at, done_at)
         SELECT gen_random_uuid(), 'orders', 'customer-' || (i % 5), 'OrderPlaced',
                convert_to('{{\"order\": ' || i || ', \"amount\": 4200}}', 'UTF8'), 'done',
                at, at + interval '2 seconds'
         FROM generate_series(1, {PUBLISHED}) AS i,
              LATERAL (SELECT now() - make_interval(secs => 3300 * power(({PUBLISHED} - i) / {PUBLISHED}.0, 1.5)) - interval '5 seconds' AS at) AS t;
         INSERT INTO {schema}.outbox (id, topic, key, kind, payload, created_at, available_at)
         SELECT gen_random_uuid(), 'orders', 'later', 'OrderPlaced', '\\x00ff10'::bytea,
                now() - interval '4 minutes', now() + interval '1 day'
         FROM generate_series(1, 5);
         INSERT INTO {schema}.outbox
                (id, topic, key, kind, headers, payload, status, attempts, last_error, dead_at)
         VALUES ('{PAYMENT_A}', 'payments', 'customer-1', 'PaymentRequested',
                 '{{\"traceparent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}}',
                 '{{\"payment\": 1}}', 'dead', 10,
                 'publish failed: broker refused message 1201', now()),
                ('{PAYMENT_B}', 'payments', 'customer-2', 'PaymentRequested', '{{}}',
                 '{{\"payment\": 2}}', 'dead', 10,
                 'publish failed: broker refused message 1202', now()),
                ('{SCRIPTED}', 'alerts', 'ops', 'Alert', '{{\"x-note\": \"<i>hi</i>\"}}',
                 convert_to('{}', 'UTF8'), 'dead', 3, 'publish failed: <b>refused</b>', now());
         INSERT INTO {schema}.inbox (consumer, message_id, processed_at)
         SELECT 'billing', 'm-' || i, now() - make_interval(mins => i)
         FROM generate_series(1, 12) AS i;
         INSERT INTO {schema}.durable_inbox
                (consumer, dedup_id, topic, payload, source, position, status, done_at, dead_at,
                 last_error, result)
         VALUES ('shipping', 'd-1', 'orders', '', 'orders', '1', 'done', now(), NULL, NULL,
                 convert_to('{{\"shipped\": true}}', 'UTF8')),
                ('shipping', 'd-2', 'orders', '', 'orders', '2', 'pending', NULL, NULL, NULL, NULL),
                ('shipping', 'd-3', 'orders', '', 'orders', '3', 'dead', NULL, now(),
                 'handler failed', NULL);
         INSERT INTO {schema}.inbox_duplicates (consumer, skipped, last_at) VALUES ('billing', 4, now());
         INSERT INTO {schema}.dedup (id, state, token, result, expires_at)
         VALUES ('payment-42', 'completed', 7, convert_to('{{\"charged\": 4200}}', 'UTF8'),
                 now() + interval '1 day')",
        SCRIPT.replace('\'', "''")
    ));
}

/// The positions on the page of messages, each row checked to have `key`; newest
/// first.
async fn page_of(browser: &Browser, key: &str) -> Vec<i64> {
    let keys = browser
        .texts("table.messages tbody td:nth-child(4)")
        .await
        .expect("rows");
    assert!(keys.iter().all(|found| found == key), "{keys:?}");
    let seqs: Vec<i64> = browser
        .texts("table.messages tbody td:nth-child(1)")
        .await
        .expect("rows")
        .iter()
        .map(|seq| seq.parse().expect("a position"))
        .collect();
    assert_eq!(seqs.len(), keys.len());
    assert!(
        seqs.windows(2).all(|pair| pair[0] > pair[1]),
        "newest first: {seqs:?}"
    );
    seqs
}

fn status_of(schema: &str, id: &str) -> String {
    psql(&format!(
        "SELECT status FROM {schema}.outbox WHERE id = '{id}'"
    ))
}

/// Entries on the `payments` stream.
async fn published_on_redis(schema: &str) -> usize {
    let client = redis::Client::open(support::redis_url()).expect("a Redis URL");
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis answers");
    let key = format!("{schema}:payments");
    let length: usize = redis::cmd("XLEN")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .expect("XLEN");
    let _: Result<(), _> = redis::cmd("DEL").arg(&key).query_async(&mut redis).await;
    length
}

/// `POST path` with a form `body` (and a cookie): the status and the body.
fn post(port: u16, path: &str, cookie: Option<&str>, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("the dashboard answers");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a timeout");
    let cookie = cookie
        .map(|cookie| format!("Cookie: {cookie}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{cookie}\
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
    (status, body.to_owned())
}

/// Where screenshots go: `docs/dashboard/` with `ONCEBOX_UPDATE_SCREENSHOTS=1`, the
/// test's directory otherwise.
fn screenshots(dir: &Path) -> PathBuf {
    if std::env::var_os("ONCEBOX_UPDATE_SCREENSHOTS").is_some_and(|value| value == "1") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/dashboard")
    } else {
        dir.join("screenshots")
    }
}
