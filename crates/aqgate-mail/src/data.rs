//! The body of a mail while DATA is under way: the first `--smtp-data-memory` bytes in
//! memory, the rest in a temporary file, so that unfinished transactions hold little
//! memory however many there are. The file lives in a private directory (mode 0700) of the
//! process and is unlinked as soon as it is created: it disappears with the transaction,
//! whatever ends it (the reply, an error, a dropped connection, the process killed).
//!
//! A complete message that went to disk is read back whole to be decided (the S/MIME
//! verification and the reinjection need it in one piece); [`DataSpool`] bounds how many
//! such messages are held in memory at once (`--smtp-max-large-messages`), the others
//! wait for their turn with their body on disk.

use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes gathered in memory between two writes to the file once the body is on disk.
const WRITE_BATCH: usize = 256 * 1024;

/// Where the bodies beyond the in-memory share go, and the bound on large messages decided
/// at once. One per listener; the private directory is made on first use and removed when
/// the last holder drops it.
#[derive(Debug)]
pub struct DataSpool {
    /// The directory the private one is made in.
    parent: PathBuf,
    /// Bytes of a body kept in memory before it goes to a file.
    pub memory: usize,
    /// Complete bodies read back from disk and held whole for their decision.
    large: Arc<Semaphore>,
    dir: OnceLock<PathBuf>,
}

impl DataSpool {
    pub fn new(parent: impl Into<PathBuf>, memory: usize, max_large: usize) -> Arc<Self> {
        Arc::new(Self {
            parent: parent.into(),
            memory,
            large: Arc::new(Semaphore::new(max_large.max(1))),
            dir: OnceLock::new(),
        })
    }

    /// The private directory, made on first use.
    fn dir(&self) -> io::Result<&Path> {
        if let Some(d) = self.dir.get() {
            return Ok(d);
        }
        let name = format!("aqgate-smtp-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple());
        let dir = self.parent.join(name);
        let mut b = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(&dir)?;
        if let Err(made) = self.dir.set(dir) {
            // Another session made one at the same moment: keep the first.
            let _ = std::fs::remove_dir(made);
        }
        Ok(self.dir.get().expect("set above"))
    }

    /// A new empty file, already unlinked: only its descriptor holds it.
    async fn file(&self) -> io::Result<tokio::fs::File> {
        let path = self.dir()?.join(uuid::Uuid::new_v4().simple().to_string());
        let mut o = std::fs::OpenOptions::new();
        o.read(true).write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        let f = o.open(&path)?;
        std::fs::remove_file(&path)?;
        let mut f = tokio::fs::File::from_std(f);
        // Its copy of each write (made for the blocking thread) stays this small.
        f.set_max_buf_size(64 * 1024);
        Ok(f)
    }

    /// A turn to hold a large message whole, waited for.
    pub async fn large_turn(&self) -> OwnedSemaphorePermit {
        self.large.clone().acquire_owned().await.expect("the semaphore is never closed")
    }
}

impl Drop for DataSpool {
    fn drop(&mut self) {
        if let Some(d) = self.dir.get() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Why a body was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Over the message size limit.
    TooBig,
    /// Writing it to disk failed (a full disk).
    Storage,
}

/// One message's body as it arrives. `buf` is what the DATA parser appends to; call
/// [`Body::settle`] after each append.
pub struct Body {
    pub buf: Vec<u8>,
    file: Option<tokio::fs::File>,
    on_disk: usize,
    refused: Option<Refused>,
}

impl Body {
    pub fn new() -> Self {
        Self { buf: Vec::new(), file: None, on_disk: 0, refused: None }
    }

    /// The body's size so far (or where it stopped being kept).
    pub fn len(&self) -> usize {
        self.on_disk + self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the body went to disk.
    pub fn spooled(&self) -> bool {
        self.file.is_some()
    }

    pub fn refused(&self) -> Option<Refused> {
        self.refused
    }

    /// After bytes were appended to `buf`: refuses a body over `max`, moves it to disk past
    /// the spool's memory share. The last byte always stays in memory (the DATA parser
    /// may take back a trailing CR it appended). Returns the error of a failed write (the
    /// body is then refused as [`Refused::Storage`] and the rest of DATA discarded).
    pub async fn settle(&mut self, max: usize, spool: &DataSpool) -> Option<io::Error> {
        if self.refused.is_some() {
            self.buf.clear();
            return None;
        }
        if self.len() > max {
            self.refuse(Refused::TooBig);
            return None;
        }
        let due = match self.file {
            None => self.buf.len() > spool.memory,
            Some(_) => self.buf.len() > WRITE_BATCH,
        };
        if !due {
            return None;
        }
        if self.file.is_none() {
            match spool.file().await {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    self.refuse(Refused::Storage);
                    return Some(e);
                }
            }
        }
        let keep = self.buf.len() - 1;
        let file = self.file.as_mut().expect("opened above");
        if let Err(e) = file.write_all(&self.buf[..keep]).await {
            self.refuse(Refused::Storage);
            return Some(e);
        }
        self.on_disk += keep;
        let last = self.buf[keep];
        // A fresh buffer: the one that held the memory share is given back.
        self.buf = Vec::with_capacity(WRITE_BATCH + 16 * 1024);
        self.buf.push(last);
        None
    }

    fn refuse(&mut self, why: Refused) {
        self.refused = Some(why);
        self.file = None;
        self.buf = Vec::new();
        self.on_disk = 0;
    }

    /// The whole body, read back from disk if it went there (the file goes with it).
    pub async fn into_bytes(mut self) -> io::Result<Vec<u8>> {
        let Some(mut f) = self.file.take() else {
            return Ok(std::mem::take(&mut self.buf));
        };
        f.flush().await?;
        f.seek(SeekFrom::Start(0)).await?;
        let mut all = Vec::with_capacity(self.len());
        (&mut f).take(self.on_disk as u64).read_to_end(&mut all).await?;
        if all.len() != self.on_disk {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the spooled body was cut short"));
        }
        all.extend_from_slice(&self.buf);
        Ok(all)
    }
}

impl Default for Body {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_past_the_memory_share_goes_to_an_unlinked_file_and_comes_back_whole() {
        let parent = std::env::temp_dir();
        let spool = DataSpool::new(&parent, 1000, 2);
        let mut body = Body::new();
        let mut want = Vec::new();
        for i in 0..400u32 {
            let chunk = format!("line {i} {}\r\n", "x".repeat(i as usize % 50));
            body.buf.extend_from_slice(chunk.as_bytes());
            want.extend_from_slice(chunk.as_bytes());
            assert!(body.settle(1 << 20, &spool).await.is_none());
            if want.len() > 1000 {
                assert!(body.spooled() && body.buf.len() <= WRITE_BATCH + 100, "{}", body.buf.len());
            }
        }
        let dir = spool.dir.get().expect("made").clone();
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&dir).expect("dir").permissions());
        assert_eq!(mode & 0o777, 0o700, "private");
        assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 0, "the file has no name");
        assert_eq!(body.into_bytes().await.expect("read back"), want);
        drop(spool);
        assert!(!dir.exists(), "removed with the spool");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_and_dropped() {
        let spool = DataSpool::new(std::env::temp_dir(), 10, 1);
        let mut body = Body::new();
        body.buf.extend_from_slice(&[b'a'; 50]);
        assert!(body.settle(100, &spool).await.is_none());
        assert!(body.spooled());
        body.buf.extend_from_slice(&[b'a'; 60]);
        body.settle(100, &spool).await;
        assert_eq!(body.refused(), Some(Refused::TooBig));
        assert!(!body.spooled() && body.is_empty());
        body.buf.extend_from_slice(b"more");
        body.settle(100, &spool).await;
        assert!(body.is_empty(), "nothing kept after the refusal");
    }

    #[tokio::test]
    async fn a_spool_that_cannot_make_its_directory_refuses_for_storage() {
        let spool = DataSpool::new("/nonexistent/aqgate", 4, 1);
        let mut body = Body::new();
        body.buf.extend_from_slice(b"0123456789");
        assert!(body.settle(100, &spool).await.is_some());
        assert_eq!(body.refused(), Some(Refused::Storage));
    }
}
