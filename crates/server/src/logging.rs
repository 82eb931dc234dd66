//! Where log events (`tracing`) go: the systemd journal when the server
//! runs as a service, else stderr. Set up once, first thing, by the
//! `strata` binary for every command.

/// Log events (`tracing`) go to the systemd journal when stderr is the
/// service's journal stream (systemd sets JOURNAL_STREAM to its device and
/// inode): each with its priority (error 3, warn 4, info 5) and its fields
/// as STRATA_* journal fields (STRATA_EVENT=alarm, STRATA_KIND=usage...).
/// Otherwise to stderr, one line each: time, level, where, message and
/// fields. STRATA_LOG sets the filter; by default a server logs at info
/// (its start, stop, alarm changes, claims, fences, jobs, refused clients)
/// and the other commands only warnings and errors.
pub fn init(serving: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // fuser warns when its own unmount at the end finds the mount gone:
    // strata-fuse unmounts first (lazily when busy).
    let default = if serving {
        "warn,fuser=error,strata=info"
    } else {
        "warn,fuser=error"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let registry = tracing_subscriber::registry().with(filter);
    if stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(j) => {
                registry
                    .with(
                        j.with_field_prefix(Some("STRATA".into()))
                            .with_syslog_identifier("strata".into()),
                    )
                    .init();
                return;
            }
            Err(e) => eprintln!("strata: no journal ({e}); logging to stderr"),
        }
    }
    registry
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours only for a person at a terminal, not in a file.
                .with_ansi(
                    std::io::IsTerminal::is_terminal(&std::io::stderr())
                        && std::env::var_os("NO_COLOR").is_none(),
                ),
        )
        .init();
}

/// Whether stderr is the journal stream systemd connected this service
/// to (JOURNAL_STREAM is "DEVICE:INODE" of it; a child whose stderr was
/// redirected elsewhere inherits the variable but not the stream).
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    let Ok(stream) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.split_once(':') else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(meta) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    use std::os::unix::fs::MetadataExt;
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}
