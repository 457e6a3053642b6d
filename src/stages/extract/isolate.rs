//! `--isolate-extraction`: files parsed in a child process, so what no thread can contain
//! (a stack overflow or an abort inside a third-party parser kills the whole process) fails
//! that one file. Each extract stage (one per CPU worker) keeps one child, `ragline
//! extract-worker`, and hands it files one at a time over its stdin and stdout: a request is
//! the format, the limits and the content; the answer is the extracted text and structure, or
//! why not. The child runs the same budgeted extraction as the parent would (a thread, a
//! deadline, a memory ceiling). A child that dies fails its file with what it said on stderr
//! (the last lines) and is started again for the next file; one that overruns the file's
//! time is killed (a real stop, where a thread could only be abandoned).
//!
//! Frames: a little-endian u64 length, then that many bytes. A request is two frames (a JSON
//! header, the content), an answer one (JSON).

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::budget::{Guarded, Limits};
use super::Extracted;

/// A request or an answer is at most this long (the content is bounded by --max-file-bytes
/// before it gets here; this bounds what one side believes of the other).
const MAX_FRAME: u64 = 4 << 30;
/// Bytes of the child's stderr kept for the reason of a death.
const STDERR_TAIL: usize = 2048;
/// How long past a file's own time limit the parent waits for the child's answer (the child
/// stops the parse at the limit and answers; this covers a child that cannot).
const GRACE: Duration = Duration::from_secs(5);

/// The request's header.
#[derive(Serialize, Deserialize)]
struct Request {
    format: String,
    /// The content is text (else bytes).
    text: bool,
    time_ms: u64,
    memory: u64,
}

/// The answer.
#[derive(Serialize, Deserialize)]
enum Answer {
    Extracted(Extracted),
    Failed(String),
    Panicked(String),
    TimedOut,
    OverMemory(u64),
    Busy(usize),
}

/// A child process that extracts files.
pub struct Isolated {
    program: PathBuf,
    child: Option<Worker>,
}

impl std::fmt::Debug for Isolated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Isolated")
            .field("program", &self.program)
            .field("running", &self.child.is_some())
            .finish()
    }
}

struct Worker {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    answers: crossbeam_channel::Receiver<std::io::Result<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Reads the child's stderr into `stderr` until the pipe closes.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Isolated {
    /// Files extracted by `program extract-worker` (the ragline binary).
    pub fn new(program: PathBuf) -> Isolated {
        Isolated {
            program,
            child: None,
        }
    }

    /// Extract `content` (text or bytes) as `format` in the child, within `limits`.
    pub(super) fn run(
        &mut self,
        format: &str,
        content: super::Content,
        limits: Limits,
    ) -> Result<Extracted, Guarded> {
        let (text, bytes) = match content {
            super::Content::Text(t) => (true, t.into_bytes()),
            super::Content::Bytes(b) => (false, b),
        };
        let header = Request {
            format: format.to_string(),
            text,
            time_ms: limits.time.as_millis().min(u64::MAX as u128) as u64,
            memory: limits.memory,
        };
        let header = serde_json::to_vec(&header).expect("a request encodes");
        if self.child.is_none() {
            self.child = Some(self.spawn()?);
        }
        let worker = self.child.as_mut().expect("started above");
        let sent = write_frame(&mut worker.stdin, &header)
            .and_then(|()| write_frame(&mut worker.stdin, &bytes))
            .and_then(|()| worker.stdin.flush());
        drop(bytes);
        let answer = match sent {
            Ok(()) => worker.answers.recv_timeout(limits.time + GRACE),
            Err(e) => Ok(Err(e)),
        };
        match answer {
            Ok(Ok(frame)) => match serde_json::from_slice::<Answer>(&frame) {
                Ok(a) => a.into_result(),
                Err(e) => {
                    self.child = None;
                    Err(Guarded::Failed(format!(
                        "the extraction process answered something unreadable ({e})"
                    )))
                }
            },
            // Over time: the child is stopped for good (no thread is left behind).
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                self.child = None;
                Err(Guarded::TimedOut)
            }
            // It died on this file (or its pipes broke): why, and a new one next time.
            Ok(Err(_)) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                let mut worker = self.child.take().expect("started above");
                let status = worker.child.wait().ok();
                // The child is gone, its stderr closed: the reader ends with its last words.
                if let Some(reader) = worker.stderr_reader.take() {
                    let _ = reader.join();
                }
                let said = String::from_utf8_lossy(
                    &worker.stderr.lock().unwrap_or_else(|e| e.into_inner()),
                )
                .trim()
                .to_string();
                let said = said.lines().last().unwrap_or("").to_string();
                Err(Guarded::Panicked(format!(
                    "the extraction process died ({}){}",
                    status.map_or("its status is unknown".into(), describe),
                    if said.is_empty() {
                        String::new()
                    } else {
                        format!(": {said}")
                    }
                )))
            }
        }
    }

    fn spawn(&self) -> Result<Worker, Guarded> {
        let mut child = Command::new(&self.program)
            .arg("extract-worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                Guarded::Failed(format!(
                    "cannot start the extraction process {} ({e}) for --isolate-extraction",
                    self.program.display()
                ))
            })?;
        let stdin = BufWriter::new(child.stdin.take().expect("piped"));
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut stderr_pipe = child.stderr.take().expect("piped");
        let (tx, answers) = crossbeam_channel::bounded(1);
        std::thread::Builder::new()
            .name("ragline-isolated-out".into())
            .spawn(move || loop {
                let frame = read_frame(&mut stdout);
                let end = frame.is_err();
                if tx.send(frame).is_err() || end {
                    return;
                }
            })
            .map_err(|e| Guarded::Failed(format!("cannot start a thread: {e}")))?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let tail = Arc::clone(&stderr);
        let stderr_reader = std::thread::Builder::new()
            .name("ragline-isolated-err".into())
            .spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = stderr_pipe.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    t.extend_from_slice(&buf[..n]);
                    let excess = t.len().saturating_sub(STDERR_TAIL);
                    t.drain(..excess);
                }
            })
            .map_err(|e| Guarded::Failed(format!("cannot start a thread: {e}")))?;
        Ok(Worker {
            child,
            stdin,
            answers,
            stderr,
            stderr_reader: Some(stderr_reader),
        })
    }
}

impl Answer {
    fn into_result(self) -> Result<Extracted, Guarded> {
        match self {
            Answer::Extracted(e) => Ok(e),
            Answer::Failed(m) => Err(Guarded::Failed(m)),
            Answer::Panicked(m) => Err(Guarded::Panicked(m)),
            Answer::TimedOut => Err(Guarded::TimedOut),
            Answer::OverMemory(b) => Err(Guarded::OverMemory(b)),
            Answer::Busy(n) => Err(Guarded::Busy(n)),
        }
    }

    fn of(result: Result<Extracted, Guarded>) -> Answer {
        match result {
            Ok(e) => Answer::Extracted(e),
            Err(Guarded::Failed(m)) => Answer::Failed(m),
            Err(Guarded::Panicked(m)) => Answer::Panicked(m),
            Err(Guarded::TimedOut) => Answer::TimedOut,
            Err(Guarded::OverMemory(b)) => Answer::OverMemory(b),
            Err(Guarded::Busy(n)) => Answer::Busy(n),
        }
    }
}

/// A child's exit as words: its signal (a stack overflow aborts with SIGABRT, a fault is
/// SIGSEGV) or its exit code.
fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.signal(), status.code()) {
        (Some(6), _) => "killed by SIGABRT: an abort, such as a stack overflow".into(),
        (Some(11), _) => "killed by SIGSEGV".into(),
        (Some(9), _) => "killed by SIGKILL (out of memory?)".into(),
        (Some(s), _) => format!("killed by signal {s}"),
        (None, Some(c)) => format!("exit code {c}"),
        (None, None) => "ended".into(),
    }
}

fn write_frame(w: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(&(bytes.len() as u64).to_le_bytes())?;
    w.write_all(bytes)
}

fn read_frame(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("a frame of {len} bytes")));
    }
    // Read as it arrives: the length alone allocates nothing.
    let mut out = Vec::new();
    r.take(len).read_to_end(&mut out)?;
    if out.len() as u64 != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(out)
}

/// The child's side (`ragline extract-worker`): requests from stdin, answers to stdout, until
/// stdin closes.
pub fn serve(input: impl Read, output: impl Write) -> std::io::Result<()> {
    let (mut input, mut output) = (BufReader::new(input), BufWriter::new(output));
    let mut stage = super::Extract::new(super::ExtractConfig::default());
    loop {
        let header = match read_frame(&mut input) {
            Ok(h) => h,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let request: Request = serde_json::from_slice(&header)
            .map_err(|e| std::io::Error::other(format!("a bad request: {e}")))?;
        let content = read_frame(&mut input)?;
        let content = if request.text {
            super::Content::Text(String::from_utf8_lossy(&content).into_owned())
        } else {
            super::Content::Bytes(content)
        };
        let limits = Limits {
            time: Duration::from_millis(request.time_ms),
            memory: request.memory,
        };
        let answer = Answer::of(stage.parse_here(&request.format, content, limits));
        let bytes = serde_json::to_vec(&answer).map_err(std::io::Error::other)?;
        write_frame(&mut output, &bytes)?;
        output.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_and_a_lying_length_allocates_nothing() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello").unwrap();
        write_frame(&mut buf, b"").unwrap();
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r).unwrap(), b"hello");
        assert_eq!(read_frame(&mut r).unwrap(), b"");
        assert!(read_frame(&mut r).is_err(), "the end");
        let mut lie = (MAX_FRAME - 1).to_le_bytes().to_vec();
        lie.extend_from_slice(b"short");
        assert!(read_frame(&mut &lie[..]).is_err());
        let mut too_long = (MAX_FRAME + 1).to_le_bytes().to_vec();
        too_long.extend_from_slice(b"x");
        assert!(read_frame(&mut &too_long[..]).is_err());
    }

    #[test]
    fn the_worker_side_answers_each_request_in_turn() {
        let mut input = Vec::new();
        for (format, text, body) in [
            ("markdown", true, &b"# Title\n\nSome text."[..]),
            ("pdf", false, &b"not a pdf"[..]),
        ] {
            let header = Request {
                format: format.into(),
                text,
                time_ms: 10_000,
                memory: 256 << 20,
            };
            write_frame(&mut input, &serde_json::to_vec(&header).unwrap()).unwrap();
            write_frame(&mut input, body).unwrap();
        }
        let mut output = Vec::new();
        serve(&input[..], &mut output).unwrap();
        let mut r = &output[..];
        let first: Answer = serde_json::from_slice(&read_frame(&mut r).unwrap()).unwrap();
        match first.into_result() {
            Ok(e) => {
                assert!(e.text.contains("Some text."), "{}", e.text);
                assert!(e.blocks.iter().any(|b| b.is_heading()));
            }
            Err(e) => panic!("{e:?}"),
        }
        let second: Answer = serde_json::from_slice(&read_frame(&mut r).unwrap()).unwrap();
        assert!(second.into_result().is_err(), "not a PDF fails");
        assert!(read_frame(&mut r).is_err(), "two answers, no more");
    }
}
