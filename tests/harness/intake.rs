//! A stand-in for the Datadog agent's profile intake: an HTTP/1.1 server on
//! 127.0.0.1 or on a Unix socket that reads each request as the intake
//! does, strictly, and answers as scripted (accept, refuse N times with a
//! 503, refuse with a 400 and a body, or never answer).
//!
//! Checked on every request (a violation is recorded in
//! [`Intake::violations`], answered 400, and fails the tests that look):
//! `POST /profiling/v1/input`; a `multipart/form-data` body with a
//! boundary; each part's `Content-Disposition: form-data; name=…;
//! filename=…`; a part `event` (file `event.json`, `application/json`)
//! holding the event keys with RFC 3339 UTC nanosecond timestamps; every
//! attachment it names as a part; the `profile.pprof` part zstd-compressed
//! pprof (magic `28 b5 2f fd`) that decodes as a pprof `Profile`; a
//! `code-provenance.json` part, when sent, zstd-compressed JSON in the
//! tracers' format.
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What the intake answers.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// 202 to every request.
    Accept,
    /// 503 to the first N requests, then 202.
    RefuseFirst(usize),
    /// 400 with this body to every request.
    BadRequest(String),
    /// Reads the request and never answers (keeps the connection open).
    NeverAnswer,
}

/// One multipart part.
#[derive(Debug, Clone)]
pub struct Part {
    pub name: String,
    pub filename: Option<String>,
    pub content_type: Option<String>,
    pub bytes: Vec<u8>,
}

/// A request the intake read and found well-formed.
#[derive(Debug, Clone)]
pub struct Received {
    /// Order of arrival among all requests (accepted or not).
    pub attempt: usize,
    /// The status it was answered with.
    pub status: u16,
    pub path: String,
    /// Header names lowercased.
    pub headers: HashMap<String, String>,
    pub parts: Vec<Part>,
    pub event: serde_json::Value,
    /// The decompressed pprof.
    pub pprof: Vec<u8>,
    pub start: SystemTime,
    pub end: SystemTime,
    /// The decompressed `code-provenance.json`, when sent.
    pub code_provenance: Option<serde_json::Value>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// `tags_profiler` as (key, value) pairs, in order.
    pub fn tags(&self) -> Vec<(String, String)> {
        self.event["tags_profiler"]
            .as_str()
            .unwrap_or_default()
            .split(',')
            .filter_map(|tag| tag.split_once(':'))
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    pub fn tag(&self, key: &str) -> Option<String> {
        self.tags()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, value)| value)
    }

    pub fn profile(&self) -> pprof::Profile {
        pprof::Profile::decode(&self.pprof).expect("checked when received")
    }
}

#[derive(Default)]
struct Log {
    received: Vec<Received>,
    violations: Vec<String>,
}

/// A running stand-in intake; stops accepting when dropped.
pub struct Intake {
    /// What to pass to `-U`.
    pub url: String,
    log: Arc<Mutex<Log>>,
    attempts: Arc<AtomicUsize>,
    /// Connections held open by [`Behaviour::NeverAnswer`].
    held: Arc<Mutex<Vec<Box<dyn Send>>>>,
    socket_path: Option<PathBuf>,
}

impl Intake {
    /// Listens on 127.0.0.1 (a free port).
    pub fn http(behaviour: Behaviour) -> Intake {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let intake = Intake::new(url, None);
        let shared = intake.shared();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = shared.clone();
                let behaviour = behaviour.clone();
                std::thread::spawn(move || serve(Box::new(stream), &behaviour, &shared));
            }
        });
        intake
    }

    /// Listens on a Unix socket in the temporary directory.
    pub fn unix(behaviour: Behaviour, name: &str) -> Intake {
        let path =
            std::env::temp_dir().join(format!("ddprof-intake-{name}-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("binding the intake's Unix socket");
        let intake = Intake::new(format!("unix://{}", path.display()), Some(path));
        let shared = intake.shared();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = shared.clone();
                let behaviour = behaviour.clone();
                std::thread::spawn(move || serve(Box::new(stream), &behaviour, &shared));
            }
        });
        intake
    }

    fn new(url: String, socket_path: Option<PathBuf>) -> Intake {
        Intake {
            url,
            log: Arc::default(),
            attempts: Arc::default(),
            held: Arc::default(),
            socket_path,
        }
    }

    fn shared(&self) -> Shared {
        Shared {
            log: self.log.clone(),
            attempts: self.attempts.clone(),
            held: self.held.clone(),
        }
    }

    /// Well-formed requests, in order of arrival.
    pub fn received(&self) -> Vec<Received> {
        self.log.lock().unwrap().received.clone()
    }

    /// Requests the real intake would have refused, and why.
    pub fn violations(&self) -> Vec<String> {
        self.log.lock().unwrap().violations.clone()
    }

    /// Connections made (each carries one request).
    pub fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }

    /// Waits until `predicate` holds for the received requests.
    pub fn wait_for(&self, timeout: Duration, predicate: impl Fn(&[Received]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if predicate(&self.log.lock().unwrap().received) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Intake {
    fn drop(&mut self) {
        if let Some(path) = &self.socket_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[derive(Clone)]
struct Shared {
    log: Arc<Mutex<Log>>,
    attempts: Arc<AtomicUsize>,
    held: Arc<Mutex<Vec<Box<dyn Send>>>>,
}

fn serve(stream: Box<dyn StreamBox>, behaviour: &Behaviour, shared: &Shared) {
    let mut reader = BufReader::new(stream);
    let attempt = shared.attempts.fetch_add(1, Ordering::SeqCst);
    let request = match read_request(&mut reader) {
        Ok(request) => request,
        Err(error) => {
            shared.log.lock().unwrap().violations.push(error.clone());
            respond(reader.get_mut(), 400, &error);
            return;
        }
    };
    let status = match behaviour {
        Behaviour::Accept => 202,
        Behaviour::RefuseFirst(n) if attempt < *n => 503,
        Behaviour::RefuseFirst(_) => 202,
        Behaviour::BadRequest(_) => 400,
        Behaviour::NeverAnswer => {
            // Keeps the connection open, unanswered, until the test ends.
            shared.held.lock().unwrap().push(Box::new(reader));
            return;
        }
    };
    if status == 503 {
        respond(reader.get_mut(), 503, "{\"error\": \"busy, try again\"}");
        return;
    }
    match check(request, attempt, status) {
        Ok(received) => shared.log.lock().unwrap().received.push(received),
        Err(error) => {
            shared.log.lock().unwrap().violations.push(error.clone());
            respond(reader.get_mut(), 400, &error);
            return;
        }
    }
    match behaviour {
        Behaviour::BadRequest(body) => respond(reader.get_mut(), 400, body),
        _ => respond(reader.get_mut(), 202, "{}"),
    }
}

trait StreamBox: Read + Write + Send {}
impl<T: Read + Write + Send> StreamBox for T {}

fn respond(stream: &mut dyn StreamBox, status: u16, body: &str) {
    let reason = match status {
        202 => "Accepted",
        400 => "Bad Request",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.flush();
}

struct RawRequest {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

fn read_request(reader: &mut BufReader<Box<dyn StreamBox>>) -> Result<RawRequest, String> {
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .map_err(|e| format!("reading the request line: {e}"))?;
    let mut words = line.split_whitespace();
    let (method, path, version) = (
        words.next().unwrap_or_default().to_string(),
        words.next().unwrap_or_default().to_string(),
        words.next().unwrap_or_default().to_string(),
    );
    if version != "HTTP/1.1" {
        return Err(format!("not an HTTP/1.1 request line: {line:?}"));
    }
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        reader
            .read_line(&mut header)
            .map_err(|e| format!("reading headers: {e}"))?;
        let header = header.trim_end_matches(['\r', '\n']);
        if header.is_empty() {
            break;
        }
        let (name, value) = header
            .split_once(':')
            .ok_or_else(|| format!("malformed header line {header:?}"))?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let chunked = headers
        .get("transfer-encoding")
        .is_some_and(|encoding| encoding.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        read_chunked(reader)?
    } else {
        let length: usize = headers
            .get("content-length")
            .ok_or("neither Content-Length nor chunked")?
            .parse()
            .map_err(|_| "a malformed Content-Length")?;
        let mut body = vec![0; length];
        reader
            .read_exact(&mut body)
            .map_err(|e| format!("reading the body: {e}"))?;
        body
    };
    Ok(RawRequest {
        method,
        path,
        headers,
        body,
    })
}

/// A `Transfer-Encoding: chunked` body (libdatadog streams its form).
fn read_chunked(reader: &mut BufReader<Box<dyn StreamBox>>) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let mut size_line = String::new();
        reader
            .read_line(&mut size_line)
            .map_err(|e| format!("reading a chunk size: {e}"))?;
        let size_text = size_line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("a malformed chunk size {size_line:?}"))?;
        if size == 0 {
            // Trailers, up to the blank line.
            loop {
                let mut line = String::new();
                reader
                    .read_line(&mut line)
                    .map_err(|e| format!("reading trailers: {e}"))?;
                if line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        let at = body.len();
        body.resize(at + size, 0);
        reader
            .read_exact(&mut body[at..])
            .map_err(|e| format!("reading a chunk: {e}"))?;
        let mut crlf = [0u8; 2];
        reader
            .read_exact(&mut crlf)
            .map_err(|e| format!("reading a chunk end: {e}"))?;
        if &crlf != b"\r\n" {
            return Err("a chunk not followed by CRLF".into());
        }
    }
}

/// The intake's checks (see the module documentation).
fn check(request: RawRequest, attempt: usize, status: u16) -> Result<Received, String> {
    if request.method != "POST" || request.path != "/profiling/v1/input" {
        return Err(format!(
            "{} {}: not the profile intake",
            request.method, request.path
        ));
    }
    let content_type = request
        .headers
        .get("content-type")
        .ok_or("no Content-Type")?;
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .ok_or_else(|| {
            format!("Content-Type {content_type:?} is not multipart/form-data with a boundary")
        })?;
    let parts = multipart_parts(&request.body, boundary)?;
    let event_part = parts
        .iter()
        .find(|part| part.name == "event")
        .ok_or("no `event` part")?;
    if event_part.filename.as_deref() != Some("event.json")
        || event_part.content_type.as_deref() != Some("application/json")
    {
        return Err(format!("the event part is {event_part:?}"));
    }
    let event: serde_json::Value = serde_json::from_slice(&event_part.bytes)
        .map_err(|e| format!("event.json is not JSON: {e}"))?;
    for key in [
        "attachments",
        "tags_profiler",
        "start",
        "end",
        "family",
        "version",
    ] {
        if event.get(key).is_none() {
            return Err(format!("event.json has no `{key}`: {event}"));
        }
    }
    if event["version"] != "4" || event["family"] != "native" {
        return Err(format!("event.json version/family: {event}"));
    }
    let start = parse_rfc3339_nanos(event["start"].as_str().unwrap_or_default())?;
    let end = parse_rfc3339_nanos(event["end"].as_str().unwrap_or_default())?;
    if end < start {
        return Err(format!("end before start: {event}"));
    }
    let attachments = event["attachments"]
        .as_array()
        .ok_or("attachments is not a list")?;
    for attachment in attachments {
        let name = attachment
            .as_str()
            .ok_or("an attachment name is not a string")?;
        if !parts
            .iter()
            .any(|part| part.name == name && part.filename.as_deref() == Some(name))
        {
            return Err(format!(
                "attachment {name} has no part of that name and file name"
            ));
        }
    }
    let profile_part = parts
        .iter()
        .find(|part| part.name == "profile.pprof")
        .ok_or("no profile.pprof part")?;
    if !profile_part.bytes.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Err("profile.pprof is not zstd (no 28 b5 2f fd magic)".into());
    }
    let pprof = zstd::stream::decode_all(&profile_part.bytes[..])
        .map_err(|e| format!("profile.pprof does not decompress: {e}"))?;
    pprof::Profile::decode(&pprof).map_err(|e| format!("profile.pprof: {e}"))?;
    let code_provenance = match parts
        .iter()
        .find(|part| part.name == "code-provenance.json")
    {
        None => None,
        Some(part) => Some(code_provenance_of(part)?),
    };
    Ok(Received {
        code_provenance,
        attempt,
        status,
        path: request.path,
        headers: request.headers,
        parts,
        event,
        pprof,
        start,
        end,
    })
}

/// A `code-provenance.json` part as Datadog's tracers send it:
/// zstd-compressed, `{"v1": [{"kind", "name", "version", "paths"}]}` with
/// `kind` one of `""`, `library`, `standard library`.
fn code_provenance_of(part: &Part) -> Result<serde_json::Value, String> {
    if !part.bytes.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Err("code-provenance.json is not zstd (no 28 b5 2f fd magic)".into());
    }
    let json = zstd::stream::decode_all(&part.bytes[..])
        .map_err(|e| format!("code-provenance.json does not decompress: {e}"))?;
    let value: serde_json::Value = serde_json::from_slice(&json)
        .map_err(|e| format!("code-provenance.json is not JSON: {e}"))?;
    let libraries = value["v1"]
        .as_array()
        .ok_or_else(|| format!("code-provenance.json has no v1 list: {value}"))?;
    for library in libraries {
        let kind = library["kind"].as_str();
        if !matches!(kind, Some("" | "library" | "standard library"))
            || !library["name"].is_string()
            || !library["version"].is_string()
            || !library["paths"].as_array().is_some_and(|paths| {
                !paths.is_empty() && paths.iter().all(serde_json::Value::is_string)
            })
        {
            return Err(format!("code-provenance.json entry: {library}"));
        }
    }
    Ok(value)
}

/// Splits a multipart body (RFC 7578).
pub fn multipart_parts(body: &[u8], boundary: &str) -> Result<Vec<Part>, String> {
    let delimiter = format!("--{boundary}");
    let find = |haystack: &[u8], from: usize, needle: &[u8]| {
        haystack[from..]
            .windows(needle.len())
            .position(|window| window == needle)
            .map(|at| at + from)
    };
    if !body.starts_with(delimiter.as_bytes()) {
        return Err("the body does not start with the boundary".into());
    }
    let mut parts = Vec::new();
    let mut at = delimiter.len();
    loop {
        if body[at..].starts_with(b"--") {
            return Ok(parts);
        }
        if !body[at..].starts_with(b"\r\n") {
            return Err("no CRLF after a boundary".into());
        }
        at += 2;
        let head_end = find(body, at, b"\r\n\r\n").ok_or("a part without a blank line")?;
        let head =
            std::str::from_utf8(&body[at..head_end]).map_err(|_| "part headers are not UTF-8")?;
        let next = find(body, head_end + 4, format!("\r\n{delimiter}").as_bytes())
            .ok_or("a part without a closing boundary")?;
        let bytes = body[head_end + 4..next].to_vec();
        let mut name = None;
        let mut filename = None;
        let mut content_type = None;
        for line in head.split("\r\n") {
            let (header, value) = line.split_once(':').ok_or("malformed part header")?;
            match header.trim().to_ascii_lowercase().as_str() {
                "content-disposition" => {
                    let mut fields = value.split(';').map(str::trim);
                    if fields.next() != Some("form-data") {
                        return Err(format!("part disposition {value:?} is not form-data"));
                    }
                    for field in fields {
                        let (key, quoted) =
                            field.split_once('=').ok_or("malformed disposition field")?;
                        let unquoted = quoted.trim_matches('"').to_string();
                        match key {
                            "name" => name = Some(unquoted),
                            "filename" => filename = Some(unquoted),
                            _ => {}
                        }
                    }
                }
                "content-type" => content_type = Some(value.trim().to_string()),
                _ => {}
            }
        }
        parts.push(Part {
            name: name.ok_or("a part without a name")?,
            filename,
            content_type,
            bytes,
        });
        at = next + 2 + delimiter.len();
    }
}

/// `2026-11-24T16:03:53.123456789Z` only (UTC, nine digits).
pub fn parse_rfc3339_nanos(text: &str) -> Result<SystemTime, String> {
    let bad = || format!("`{text}` is not an RFC 3339 UTC timestamp with nanoseconds");
    let bytes = text.as_bytes();
    if bytes.len() != 30 || bytes[29] != b'Z' || bytes[19] != b'.' || bytes[10] != b'T' {
        return Err(bad());
    }
    let number = |range: std::ops::Range<usize>| -> Result<i64, String> {
        text.get(range)
            .filter(|digits| digits.chars().all(|c| c.is_ascii_digit()))
            .and_then(|digits| digits.parse().ok())
            .ok_or_else(bad)
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let nanos = number(20..29)?;
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(bad());
    }
    // Days since 1970-01-01 (proleptic Gregorian, years from March).
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * m + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    Ok(UNIX_EPOCH + Duration::new(seconds as u64, nanos as u32))
}

pub use crate::pprof;
