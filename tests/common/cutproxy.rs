//! A TCP proxy a test puts between aqgate and a broker: it forwards bytes both ways, and
//! [`CutProxy::cut`] drops every connection through it at once, both sides, with a reset
//! (a network that fails under a live link); [`CutProxy::refuse`] makes it close new
//! connections at once while set, as a broker that cannot be reached. It runs on a thread
//! and a runtime of its own, so a test may block while it works.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct CutProxy {
    pub port: u16,
    cuts: watch::Sender<usize>,
    refusing: Arc<AtomicBool>,
    /// Connections forwarded so far, and those open now.
    pub accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Closes `s` with a reset rather than a FIN: what a cut cable and a dead host look like.
fn reset(s: TcpStream) {
    #[allow(deprecated)] // a zero linger does not block the drop
    let _ = s.set_linger(Some(Duration::ZERO));
    drop(s);
}

impl CutProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to 127.0.0.1:`upstream`.
    pub fn start(upstream: u16) -> Self {
        let (cuts, _) = watch::channel(0usize);
        let refusing = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let (c, r, a, o) = (cuts.clone(), refusing.clone(), accepted.clone(), open.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("the proxy's runtime");
            rt.block_on(async move {
                let l = TcpListener::bind("127.0.0.1:0").await.expect("proxy listens");
                port_tx.send(l.local_addr().expect("addr").port()).expect("port");
                loop {
                    let (down, _) = tokio::select! {
                        a = l.accept() => match a { Ok(x) => x, Err(_) => continue },
                        _ = &mut stopped => return,
                    };
                    if r.load(Ordering::SeqCst) {
                        reset(down);
                        continue;
                    }
                    a.fetch_add(1, Ordering::SeqCst);
                    let mut cut = c.subscribe();
                    let open = o.clone();
                    tokio::spawn(async move {
                        let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                            reset(down);
                            return;
                        };
                        let _ = down.set_nodelay(true);
                        let _ = up.set_nodelay(true);
                        let (mut down, mut up) = (down, up);
                        open.fetch_add(1, Ordering::SeqCst);
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                            _ = cut.changed() => {}
                        }
                        open.fetch_sub(1, Ordering::SeqCst);
                        reset(down);
                        reset(up);
                    });
                }
            });
        });
        let port = port_rx.recv_timeout(Duration::from_secs(10)).expect("the proxy's port");
        Self { port, cuts, refusing, accepted, open, stop: Some(stop), thread: Some(thread) }
    }

    /// Drops every connection through the proxy now, both sides; how many were open.
    pub fn cut(&self) -> usize {
        let open = self.open();
        self.cuts.send_modify(|n| *n += 1);
        open
    }

    /// The connections open through the proxy now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// While `on`, new connections are closed as soon as they are accepted.
    pub fn refuse(&self, on: bool) {
        self.refusing.store(on, Ordering::SeqCst);
    }

    /// The number of cuts so far.
    pub fn cuts(&self) -> usize {
        *self.cuts.borrow()
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        let _ = self.cut();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
