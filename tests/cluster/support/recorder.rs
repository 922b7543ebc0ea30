//! A tiny HTTP server that records every request it receives and answers each with the same
//! response: the far end of a redirect, or a proxy, that a read-only client must never reach.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

pub struct Recorder {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    /// Listens on a free loopback port and answers every request with `response` (a whole
    /// HTTP/1.1 response, status line first). The server lives as long as the test binary.
    pub fn start(response: String) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (recorded, response) = (recorded.clone(), response.clone());
                std::thread::spawn(move || serve(stream, &recorded, &response));
            }
        });
        Recorder { url, requests }
    }

    /// Answers every request with `status` and `body` (JSON), plus `headers`.
    pub fn answering(status: &str, headers: &[(&str, &str)], body: &str) -> Recorder {
        let mut response = format!("HTTP/1.1 {status}\r\n");
        for (name, value) in headers {
            response.push_str(&format!("{name}: {value}\r\n"));
        }
        response.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        Recorder::start(response)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every request received so far: its head and body, as text.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// Reads one request (head, then as many body bytes as `Content-Length` says), records it, and
/// answers.
fn serve(stream: TcpStream, recorded: &Mutex<Vec<String>>, response: &str) {
    let mut reader = BufReader::new(&stream);
    let mut head = String::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
        let end = line == "\r\n";
        head.push_str(&line);
        if end {
            break;
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    if !head.is_empty() {
        let request = head + &String::from_utf8_lossy(&body);
        if let Ok(mut requests) = recorded.lock() {
            requests.push(request);
        }
    }
    let _ = (&stream).write_all(response.as_bytes());
}
