//! A local HTTP server the web tests change as they go: pages by path with their status,
//! content type and body, and a count of the GETs of each path (a test shows what a run
//! downloaded). HTTP/1.1, one request per connection (`Connection: close`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

#[derive(Clone)]
struct Page {
    status: u16,
    content_type: String,
    body: Vec<u8>,
    /// A redirect's target.
    location: Option<String>,
    /// How long the server waits before answering.
    delay: std::time::Duration,
}

#[derive(Default)]
struct State {
    pages: HashMap<String, Page>,
    hits: HashMap<String, usize>,
    /// GETs of each path answered 304 (the client's If-None-Match was the page's ETag).
    not_modified: HashMap<String, usize>,
}

pub struct Site {
    base: String,
    state: Arc<Mutex<State>>,
}

impl Site {
    /// A server on a free port of 127.0.0.1, serving until the test process ends.
    pub fn start() -> Site {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let served = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = Arc::clone(&served);
                std::thread::spawn(move || {
                    let _ = answer(stream, &state);
                });
            }
        });
        Site { base, state }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Serve `body` at `path` with status 200.
    pub fn put(&self, path: &str, content_type: &str, body: &str) {
        self.put_status(path, 200, content_type, body);
    }

    pub fn put_status(&self, path: &str, status: u16, content_type: &str, body: &str) {
        self.insert(
            path,
            Page {
                status,
                content_type: content_type.to_string(),
                body: body.as_bytes().to_vec(),
                location: None,
                delay: std::time::Duration::ZERO,
            },
        );
    }

    /// Answer `path` with a 301 to `to` (a path or a URL).
    pub fn redirect(&self, path: &str, to: &str) {
        self.insert(
            path,
            Page {
                status: 301,
                content_type: "text/plain".into(),
                body: Vec::new(),
                location: Some(to.to_string()),
                delay: std::time::Duration::ZERO,
            },
        );
    }

    /// Serve `body` at `path` after `delay`.
    pub fn put_slow(&self, path: &str, body: &str, delay: std::time::Duration) {
        self.insert(
            path,
            Page {
                status: 200,
                content_type: "text/html".into(),
                body: body.as_bytes().to_vec(),
                location: None,
                delay,
            },
        );
    }

    /// Stop serving `path` (404).
    pub fn remove(&self, path: &str) {
        self.state.lock().unwrap().pages.remove(path);
    }

    fn insert(&self, path: &str, page: Page) {
        self.state
            .lock()
            .unwrap()
            .pages
            .insert(path.to_string(), page);
    }

    /// How many GETs of `path` were answered 304 Not Modified.
    pub fn not_modified(&self, path: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .not_modified
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// How many GETs `path` has had.
    pub fn hits(&self, path: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .hits
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

fn answer(stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The headers, up to the blank line (GETs have no body).
    let mut if_none_match = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("if-none-match") {
                if_none_match = Some(value.trim().to_string());
            }
        }
    }
    let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
    let page = {
        let mut s = state.lock().unwrap();
        *s.hits.entry(path.clone()).or_default() += 1;
        s.pages.get(&path).cloned()
    };
    let page = page.unwrap_or(Page {
        status: 404,
        content_type: "text/plain".into(),
        body: b"not found".to_vec(),
        location: None,
        delay: std::time::Duration::ZERO,
    });
    std::thread::sleep(page.delay);
    // A 200 carries the ETag of its body; a GET that names it gets a 304 without one.
    let etag = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        page.body.hash(&mut h);
        format!("\"{:016x}\"", h.finish())
    };
    if page.status == 200 && if_none_match.as_deref() == Some(etag.as_str()) {
        *state.lock().unwrap().not_modified.entry(path).or_default() += 1;
        let mut out = stream;
        write!(
            out,
            "HTTP/1.1 304 Not Modified\r\nETag: {etag}\r\nConnection: close\r\n\r\n"
        )?;
        return out.flush();
    }
    let etag = if page.status == 200 {
        format!("ETag: {etag}\r\n")
    } else {
        String::new()
    };
    let location = page
        .location
        .map(|l| format!("Location: {l}\r\n"))
        .unwrap_or_default();
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {} X\r\nContent-Type: {}\r\nContent-Length: {}\r\n{etag}{location}Connection: close\r\n\r\n",
        page.status,
        page.content_type,
        page.body.len()
    )?;
    out.write_all(&page.body)?;
    out.flush()
}
