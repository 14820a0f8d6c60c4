//! The bad-input corpus of the agent (docs/security.md), run against the real `pko-agent` binary and
//! the real `pulumi` and `git`: option-like git URLs and revisions, every archive attack (traversal,
//! absolute paths, symlink chains, hard links, devices, PAX and GNU header bombs, sparse files, huge
//! entry counts, zip bombs, truncated and garbage gzip), hanging and slow artifact servers, and config
//! larger than a command line. Each case asserts a clear error, nothing written outside the agent's work
//! directory, and bounded memory and disk (the agent's peak RSS is read from `/proc`).

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use common::*;
use pko_agent::archive::testing::{Item, build, pax_record, tar};
use pko_proto::v1::{ArtifactSource, ErrorReason, GitSource, OperationType, ResultStatus, Source, source};

fn reason(r: &pko_proto::v1::OperationResult) -> ErrorReason {
    r.error.as_ref().map(|e| ErrorReason::try_from(e.reason).unwrap()).unwrap_or(ErrorReason::Unspecified)
}

/// Peak resident memory of process `pid` (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Bytes of regular files under `dir`.
fn disk_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                total += e.metadata().unwrap().len();
            }
        }
    }
    total
}

/// A gzipped tar whose first entry is a header of `entry_type` declaring `size` bytes, followed by
/// `size` zero bytes streamed through the compressor (a bomb that is small on the wire), then a file.
fn zero_bomb(entry_type: u8, name: &str, size: u64) -> Vec<u8> {
    let header = tar(&[Item::Raw { entry_type, name, data: vec![], declared: Some(size) }]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&header[..512]).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut left = size.div_ceil(512) * 512;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        gz.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    gz.write_all(&tar(&[Item::File("Pulumi.yaml", b"name: x\nruntime: yaml\n")])).unwrap();
    gz.finish().unwrap()
}

/// A PAX header saying the next entry is `size` bytes while its ustar header says 0, then `size` zeros.
fn pax_size_bomb(size: u64) -> Vec<u8> {
    let pax = tar(&[Item::Raw {
        entry_type: b'x',
        name: "pax",
        data: pax_record("size", &size.to_string()),
        declared: None,
    }]);
    let file = tar(&[Item::File("bomb.bin", b"")]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&pax[..pax.len() - 1024]).unwrap();
    gz.write_all(&file[..512]).unwrap();
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..size / chunk.len() as u64 {
        gz.write_all(&chunk).unwrap();
    }
    gz.write_all(&[0u8; 1024]).unwrap();
    gz.finish().unwrap()
}

/// The first half of `bytes` (a gzip stream cut short).
fn truncated(bytes: &[u8]) -> Vec<u8> {
    bytes[..bytes.len() / 2].to_vec()
}

/// A chain of links climbing one directory per link from the extraction directory to `/`, then a file
/// written through the chain into `target_dir`.
fn symlink_chain(levels: usize, target_dir: &str, file: &str) -> Vec<u8> {
    let names: Vec<String> = (0..=levels).map(|i| format!("l{i}")).collect();
    let targets: Vec<String> =
        (0..=levels).map(|i| if i == 0 { ".".to_string() } else { format!("l{}/..", i - 1) }).collect();
    let through = format!("l{levels}{target_dir}/{file}");
    let mut items: Vec<Item<'_>> = names.iter().zip(&targets).map(|(n, t)| Item::Symlink(n, t)).collect();
    items.push(Item::File(&through, b"pwned"));
    items.push(Item::File("Pulumi.yaml", b"name: x\nruntime: yaml\n"));
    build(&items)
}

#[tokio::test]
async fn option_like_git_urls_and_revisions_never_run_a_command() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let marks = tempfile::tempdir().unwrap();
    let m = |n: &str| marks.path().join(n).display().to_string();
    let root = env.dir().join(format!("repos-{}", rand_suffix()));
    pko_testbed::git::bare_repo_with(&root, "g.git", &[("Pulumi.yaml", "name: g\nruntime: yaml\n")]);
    let repo = root.join("g.git");
    let good_url = format!("file://{}", repo.display());
    let cases = [
        (format!("--upload-pack=touch {}", m("url")), "main".to_string(), "option"),
        (good_url.clone(), format!("--upload-pack=touch {}", m("rev")), "option"),
        (format!("ext::sh -c touch% {}", m("ext")), "main".to_string(), "white space"),
        (format!("ext::touch%S{}", m("ext2")), "main".to_string(), "remote helper"),
        (format!("ssh://-oProxyCommand=touch%20{}/r", m("ssh")), "main".to_string(), "starts with '-'"),
        (good_url.clone(), "main\n--upload-pack=x".to_string(), "white space"),
    ];
    for (i, (url, revision, text)) in cases.into_iter().enumerate() {
        let mut req = request(&env, &format!("git-{i}"), &repo, "dev", OperationType::Preview);
        req.source = Some(Source {
            kind: Some(source::Kind::Git(GitSource {
                url: url.clone(),
                revision: revision.clone(),
                dir: String::new(),
                shallow: false,
                auth: None,
            })),
        });
        match c.run(req).await {
            // refused at the door, naming the field
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{url} {revision}");
                assert!(status.message().contains(text), "{url:?} {revision:?}: {}", status.message());
            }
            Ok(_) => panic!("{url:?} {revision:?} was accepted"),
        }
    }
    assert_eq!(std::fs::read_dir(marks.path()).unwrap().count(), 0, "no command ran");
    // the same repository with a real branch still works
    let mut req = request(&env, "git-ok", &repo, "dev", OperationType::Preview);
    req.source = Some(Source {
        kind: Some(source::Kind::Git(GitSource {
            url: good_url,
            revision: "main".into(),
            dir: String::new(),
            shallow: false,
            auth: None,
        })),
    });
    let r = result(&run(&mut c, req).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
}

#[tokio::test]
async fn hostile_archives_are_refused_with_bounded_memory_and_disk() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let victim = format!("pko-hostile-{}", rand_suffix());
    let yaml: &[u8] = b"name: x\nruntime: yaml\n";
    let started = Instant::now();
    let many: Vec<String> = (0..120_000).map(|i| format!("f{i}")).collect();
    let corpus: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "path traversal",
            build(&[Item::File("Pulumi.yaml", yaml), Item::File(&format!("../../../../tmp/{victim}-1"), b"x")]),
            "unsafe path",
        ),
        (
            "absolute path",
            build(&[Item::File("Pulumi.yaml", yaml), Item::File(&format!("/tmp/{victim}-2"), b"x")]),
            "unsafe path",
        ),
        ("symlink chain to /", symlink_chain(12, "/tmp", &format!("{victim}-3")), "unsafe link"),
        (
            "link out then a file through it",
            build(&[Item::Symlink("out", "/tmp"), Item::File(&format!("out/{victim}-4"), b"x")]),
            "unsafe link",
        ),
        ("hard link", build(&[Item::File("Pulumi.yaml", yaml), Item::HardLink("passwd", "/etc/passwd")]), "hard link"),
        (
            "character device",
            build(&[Item::Raw { entry_type: b'3', name: "dev-null", data: vec![], declared: None }]),
            "not supported",
        ),
        ("fifo", build(&[Item::Raw { entry_type: b'6', name: "pipe", data: vec![], declared: None }]), "not supported"),
        (
            "sparse file",
            build(&[Item::Raw { entry_type: b'S', name: "sparse", data: vec![], declared: None }]),
            "sparse",
        ),
        ("GNU long-name bomb (600 MiB)", zero_bomb(b'L', "././@LongLink", 600 << 20), "metadata header"),
        ("PAX header bomb (600 MiB)", zero_bomb(b'x', "pax", 600 << 20), "metadata header"),
        ("PAX size bomb (512 MiB behind a 0-byte header)", pax_size_bomb(512 << 20), "PAX size"),
        ("zip bomb (200 MiB of zeros)", zero_bomb(b'0', "zeros.bin", 200 << 20), "limit"),
        ("120,000 entries", build(&many.iter().map(|n| Item::File(n, b"")).collect::<Vec<_>>()), "entries"),
        (
            "truncated gzip",
            truncated(&build(&[
                Item::File("Pulumi.yaml", yaml),
                Item::File("a", &(0..50_000u32).map(|i| (i * 7919 % 251) as u8).collect::<Vec<_>>()),
            ])),
            "reading archive",
        ),
        ("not gzip", b"<html>this is not an artifact</html>".to_vec(), "reading archive"),
    ];
    eprintln!("corpus built in {:?}", started.elapsed());
    let files: HashMap<String, Vec<u8>> =
        corpus.iter().enumerate().map(|(i, (_, b, _))| (format!("/{i}.tar.gz"), b.clone())).collect();
    let server = serve_files(files).await;
    for (i, (what, bytes, text)) in corpus.iter().enumerate() {
        let mut req = request(&env, &format!("art-{i}"), env.dir(), "dev", OperationType::Preview);
        req.source = Some(Source {
            kind: Some(source::Kind::Artifact(ArtifactSource {
                url: format!("{}/{i}.tar.gz", server.base),
                digest: sha256(bytes),
                dir: String::new(),
                mirrors: vec![],
            })),
        });
        let t = Instant::now();
        let r = result(&run(&mut c, req).await);
        eprintln!("{what}: {} bytes on the wire, refused in {:?}: {}", bytes.len(), t.elapsed(), r.message);
        assert_eq!(r.status, ResultStatus::Failed as i32, "{what} was accepted");
        assert_eq!(reason(&r), ErrorReason::InvalidSource, "{what}: {}", r.message);
        assert!(r.message.contains(text), "{what}: {:?} lacks {text:?}", r.message);
    }
    for n in 1..=4 {
        assert!(
            !std::path::Path::new(&format!("/tmp/{victim}-{n}")).exists(),
            "case {n} wrote outside the work directory"
        );
    }
    let peak = peak_rss_kib(agent.child.id());
    let disk = disk_bytes(agent.work.path());
    eprintln!("agent peak RSS {} MiB, work directory {} KiB after the corpus", peak / 1024, disk / 1024);
    assert!(peak < 96 << 10, "the agent's peak RSS was {} MiB", peak / 1024);
    assert!(disk < 4 << 20, "{disk} bytes left in the work directory");
}

/// A server that accepts connections and never answers.
async fn hanging_server() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    (base, task)
}

/// A server that sends its headers, then one byte every 500 ms of a 1 MiB body.
async fn dripping_server() -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut request = [0u8; 4096];
                let _ = sock.read(&mut request).await;
                let _ = sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n").await;
                for _ in 0..1_048_576 {
                    if sock.write_all(b"\0").await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            });
        }
    });
    (base, task)
}

/// A silent server ends each attempt at the read timeout and is retried; a server that drips a byte
/// every 500 ms defeats the read timeout, and the one deadline of the whole download (every attempt
/// and wait) ends it, named by its host and the limit — not once per attempt.
#[tokio::test]
async fn hanging_and_slow_artifact_servers_time_out_and_retry() {
    let env = pulumi_env();
    let agent = Agent::start(
        &env,
        &[
            "--auth",
            "none",
            "--artifact-connect-timeout-seconds",
            "2",
            "--artifact-read-timeout-seconds",
            "2",
            "--artifact-timeout-seconds",
            "6",
            "--artifact-retries",
            "3",
        ],
        &[],
    );
    let mut c = agent.client().await;
    let (hang, _h) = hanging_server().await;
    let (drip, _d) = dripping_server().await;
    for (what, base) in [("hanging server", hang), ("dripping server", drip)] {
        let mut req = request(&env, &format!("slow-{what}"), env.dir(), "dev", OperationType::Preview);
        req.source = Some(Source {
            kind: Some(source::Kind::Artifact(ArtifactSource {
                url: format!("{base}/a.tar.gz?token=t0ken"),
                digest: sha256(b"x"),
                dir: String::new(),
                mirrors: vec![],
            })),
        });
        let t = Instant::now();
        let r = result(&run(&mut c, req).await);
        let took = t.elapsed();
        eprintln!("{what}: failed after {took:?}: {}", r.message);
        assert_eq!(reason(&r), ErrorReason::InvalidSource, "{what}: {}", r.message);
        let host = base.trim_start_matches("http://");
        let deadline = r.message.contains(&format!("from {host}: not complete within 6 s"));
        assert!(deadline || (what == "hanging server" && r.message.contains("timed out")), "{what}: {}", r.message);
        assert!(
            what == "hanging server" || deadline,
            "the dripping server ends at the download's deadline: {}",
            r.message
        );
        assert!(!r.message.contains("t0ken"), "the URL's query never reaches the message: {}", r.message);
        // one deadline for all attempts (before: up to 4 attempts of 6 s each, plus 7 s of waits)
        assert!(took < Duration::from_secs(10), "{what} took {took:?}");
        assert!(took >= Duration::from_secs(4), "{what}: ended before its timeouts ({took:?})");
    }
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(log.contains("artifact download failed; retrying"), "the silent server was retried: {log}");
}

#[tokio::test]
async fn config_larger_than_a_command_line_is_applied_and_a_huge_env_value_is_a_clear_error() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let dir = project(
        &env,
        "bigcfg",
        "config:\n  big:\n    type: string\n  secretBig:\n    type: string\noutputs:\n  big: ${big}\n  secretBig: \
            ${secretBig}\n",
    );
    let big = "b".repeat(300 << 10);
    let secret_big = "s".repeat(200 << 10);
    let mut req = request(&env, "bigcfg", &dir, "dev", OperationType::Up);
    req.config =
        vec![config("big", serde_json::json!(big), false), config("secretBig", serde_json::json!(secret_big), true)];
    req.config.extend((0..40).map(|i| config(&format!("filler{i}"), serde_json::json!("f".repeat(20 << 10)), false)));
    let events = run(&mut c, req).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    let out = outputs(&r);
    assert_eq!(out["big"].0.as_str().map(str::len), Some(big.len()));
    assert_eq!(out["secretBig"], (serde_json::json!(secret_big), true));

    let mut req = request(&env, "bigenv", &dir, "dev", OperationType::Preview);
    req.env.push(pko_proto::v1::EnvVar {
        name: "HUGE".into(),
        value: Some(literal(&"h".repeat(200 << 10))),
        secret: false,
    });
    let r = result(&run(&mut c, req).await);
    assert_eq!(reason(&r), ErrorReason::InvalidConfig, "{}", r.message);
    assert!(r.message.contains("env HUGE") && r.message.contains("bytes"), "{}", r.message);
}

#[tokio::test]
async fn a_pulumi_yaml_program_error_is_the_failure_message() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let dir = project(
        &env,
        "yamlerr",
        "resources:\n  r:\n    type: command:local:Command\n    properties:\n      create: ${missing.value}\n",
    );
    let r = result(&run(&mut c, request(&env, "yamlerr", &dir, "dev", OperationType::Up)).await);
    assert_eq!(r.status, ResultStatus::Failed as i32);
    assert!(r.message.contains("\"missing\" not found") && r.message.contains("Pulumi.yaml line"), "{}", r.message);
}

/// Secret values never reach what an operation prints — the agent's standard output, the events it
/// streams to the operator (which keeps them for `kubectl pko logs`), the result — in any form a
/// program prints them: plain, inside a URL, with quotes and backslashes (and JSON-escaped in engine
/// events), and a multi-line value (a PEM key) printed whole and one line of it alone.
#[tokio::test]
async fn secret_values_never_reach_the_output_in_any_form() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let pem = "-----BEGIN TEST KEY-----\nAAAA-first-key-line-x9\nBBBB-second-key-line-y8\n-----END TEST KEY-----";
    let quoted = "qu\"o\\te-S3c";
    let dir = project(
        &env,
        "leaks",
        "config:\n  pw:\n    type: string\n  pem:\n    type: string\n  quoted:\n    type: string\nresources:\n  \
            boom:\n    type: command:local:Command\n    properties:\n      environment:\n        PW: ${pw}\n        \
            PEM: ${pem}\n        Q: ${quoted}\n      create: |\n        echo \"plain $PW\"; echo \"$PEM\" >&2; echo \
            \"$PEM\" | sed -n 3p >&2; printf 'q=%s\\n' \"$Q\" >&2; echo \"url=https://user:$PW@example.invalid/x\" \
            >&2; exit 4\n",
    );
    let mut req = request(&env, "team-a/leaks-1/uid-1", &dir, "dev", OperationType::Up);
    req.config = vec![
        config("pw", serde_json::json!("Pl41n-S3cret-v"), true),
        config("pem", serde_json::json!(pem), true),
        config("quoted", serde_json::json!(quoted), true),
    ];
    let events = run(&mut c, req).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Failed as i32, "{}", r.message);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let streamed: String =
        events.iter().filter_map(pko_proto::lines::line_of).map(|(s, t)| format!("{s}: {t}\n")).collect();
    let raw: String = events.iter().map(|e| format!("{e:?}\n")).collect();
    assert!(streamed.contains("exit") || streamed.contains("error:"), "the failure is printed:\n{streamed}");
    let escaped = serde_json::to_string(quoted).unwrap();
    for (what, text) in [
        ("the agent's output", agent.output()),
        ("the streamed lines", streamed),
        ("the raw events", raw),
        ("the result", format!("{r:?}")),
    ] {
        for secret in
            ["Pl41n-S3cret-v", "AAAA-first-key-line-x9", "BBBB-second-key-line-y8", quoted, escaped.trim_matches('"')]
        {
            assert!(!text.contains(secret), "{secret:?} in {what}:\n{text}");
        }
    }
}
