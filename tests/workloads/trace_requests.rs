//! trace-requests ABI SECONDS THREADS: serves fake requests on THREADS
//! threads for SECONDS, each request publishing its own span ids the way a
//! tracer does, with the real publisher crates:
//! - `otel`: `libdd-otel-thread-ctx` (OTEP 4947), after publishing an
//!   OpenTelemetry process context (OTEP 4719, a memfd `OTEL_CTX`) whose
//!   key map names the record's attribute keys (`datadog.local_root_span_id`,
//!   `http.route`), as dd-trace publishes it;
//! - `labels`: Polar Signals' `custom-labels`, with the labels dd-trace-go
//!   sets (`span id`, `local root span id`, decimal) and a `customer`;
//! - `none`: the same requests, nothing published (the bench's baseline).
//!
//! A request spins in `request_work` (~15 ms) with its context published;
//! between requests the thread spins in `idle_work` (~5 ms) with none.
//! Request `k` of the thread with id `tid` has span id `tid << 24 | k`
//! and local root span id `span | 1 << 62`, so a sample's span id says
//! which thread and request it must be of.
use std::time::{Duration, Instant};

/// Inlined into each caller, so that its samples' innermost function is
/// the caller (a call to it would be a tail call that leaves no frame).
#[inline(always)]
fn spin(until: Instant, seed: u64) -> u64 {
    let mut x = seed;
    while Instant::now() < until {
        for i in 0..1000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

#[inline(never)]
fn request_work(ms: u64, seed: u64) -> u64 {
    spin(Instant::now() + Duration::from_millis(ms), seed)
}

#[inline(never)]
fn idle_work(ms: u64, seed: u64) -> u64 {
    spin(Instant::now() + Duration::from_millis(ms), seed)
}

fn gettid() -> u64 {
    // SAFETY: gettid takes no argument and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

/// A length-delimited protobuf field (lengths below 16384).
fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![number << 3 | 2];
    if bytes.len() >= 128 {
        out.push((bytes.len() as u8) | 0x80);
        out.push((bytes.len() >> 7) as u8);
    } else {
        out.push(bytes.len() as u8);
    }
    out.extend_from_slice(bytes);
    out
}

/// `KeyValue { key, value: AnyValue }` with `value` an encoded AnyValue.
fn key_value(key: &str, any_value: Vec<u8>) -> Vec<u8> {
    let mut out = field(1, key.as_bytes());
    out.extend(field(2, &any_value));
    out
}

fn string_value(value: &str) -> Vec<u8> {
    field(1, value.as_bytes())
}

/// Publishes the process context (OTEP 4719): header then payload in a
/// memfd named OTEL_CTX, the signature written last.
fn publish_process_context(service: &str, keys: &[&str]) {
    let mut resource = Vec::new();
    resource.extend(field(1, &key_value("service.name", string_value(service))));
    let mut payload = field(1, &resource);
    payload.extend(field(
        2,
        &key_value("threadlocal.schema_version", string_value("tlsdesc_v1_dev")),
    ));
    let array: Vec<u8> = keys
        .iter()
        .flat_map(|key| field(1, &string_value(key)))
        .collect();
    payload.extend(field(
        2,
        &key_value("threadlocal.attribute_key_map", field(5, &array)),
    ));
    let size = 4096usize;
    // SAFETY: plain system calls; the mapping is checked before use and
    // kept for the life of the process.
    unsafe {
        let fd = libc::memfd_create(c"OTEL_CTX".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0, "memfd_create");
        assert_eq!(libc::ftruncate(fd, size as libc::off_t), 0);
        let mapping = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        ) as *mut u8;
        assert_ne!(mapping as *mut libc::c_void, libc::MAP_FAILED);
        libc::close(fd);
        let payload_at = mapping.add(32);
        std::ptr::copy_nonoverlapping(payload.as_ptr(), payload_at, payload.len());
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut now);
        let published = now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64;
        std::ptr::write_unaligned(mapping.add(8) as *mut u32, 2);
        std::ptr::write_unaligned(mapping.add(12) as *mut u32, payload.len() as u32);
        std::ptr::write_unaligned(mapping.add(16) as *mut u64, published);
        std::ptr::write_unaligned(mapping.add(24) as *mut u64, payload_at as u64);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        std::ptr::copy_nonoverlapping(b"OTEL_CTX".as_ptr(), mapping, 8);
    }
}

fn serve(abi: &str, until: Instant) -> u64 {
    let tid = gettid();
    let mut sum = 0u64;
    let mut request = 0u64;
    while Instant::now() < until {
        request += 1;
        let span = tid << 24 | request;
        let root = span | 1 << 62;
        match abi {
            "otel" => {
                use libdd_otel_thread_ctx::linux::OwnedThreadContext;
                let mut trace_id = [0u8; 16];
                trace_id[..8].copy_from_slice(&tid.to_be_bytes());
                trace_id[8..].copy_from_slice(&request.to_be_bytes());
                let route = format!("/thread/{tid}");
                let context = OwnedThreadContext::new(
                    trace_id,
                    span.to_be_bytes(),
                    1,
                    root.to_be_bytes(),
                    &[(1, route.as_str())],
                );
                let _ = context.attach();
                sum = sum.wrapping_add(request_work(15, span));
                drop(OwnedThreadContext::detach());
            }
            "none" => sum = sum.wrapping_add(request_work(15, span)),
            _ => {
                let (span_text, root_text) = (span.to_string(), root.to_string());
                let labels = [
                    ("span id", span_text.as_str()),
                    ("local root span id", root_text.as_str()),
                    ("customer", "acme"),
                ];
                sum = sum.wrapping_add(custom_labels::with_labels(labels, || {
                    request_work(15, span)
                }));
            }
        }
        sum = sum.wrapping_add(idle_work(5, request));
    }
    sum
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: trace-requests otel|labels|none SECONDS THREADS");
        std::process::exit(2);
    }
    let abi = args[1].clone();
    let seconds: f64 = args[2].parse().expect("SECONDS");
    let threads: usize = args[3].parse().expect("THREADS");
    if abi == "otel" {
        publish_process_context(
            "trace-requests",
            &["datadog.local_root_span_id", "http.route"],
        );
    }
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let abi = abi.clone();
            std::thread::spawn(move || serve(&abi, until))
        })
        .collect();
    let sum = workers
        .into_iter()
        .fold(0u64, |sum, worker| sum.wrapping_add(worker.join().unwrap()));
    println!("{sum}");
}
