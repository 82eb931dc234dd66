//! What a long command shows while it runs, on stderr: on a terminal a
//! progress bar (and the job's id and how to detach); elsewhere (cron,
//! a pipe, a log) plain lines, the job's id at once and its progress now
//! and then, so a log says what ran even when nobody watched.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use strata_api::units::human;
use strata_api::wire::Watch;
use strata_api::JobInfo;
use strata_cli::output::{progress_bar, Format};

/// Progress lines off a terminal: at most one a this often, and one per
/// tenth of the work.
const LINE_EVERY: Duration = Duration::from_secs(1);

/// A long command's progress for people (see the module's docs).
pub struct Reporter {
    bar: Option<ProgressBar>,
    /// Plain lines (not a terminal, not `--json`): what runs, named so.
    lines: Option<String>,
    /// Whether the work counts bytes (else only its share is shown).
    bytes: bool,
    tenth: u64,
    last: Option<Instant>,
}

impl Reporter {
    /// For work that reports progress (`shows`) described as `what`,
    /// counted in bytes when `bytes`.
    pub fn new(shows: bool, what: String, bytes: bool, format: Format) -> Reporter {
        let template = match bytes {
            true => "{spinner} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            false => "{spinner} [{bar:40}] {percent}% eta {eta}",
        };
        let plain = shows && format == Format::Human && !std::io::stderr().is_terminal();
        Reporter {
            bar: progress_bar(shows && format == Format::Human, template),
            lines: plain.then_some(what),
            bytes,
            tenth: 0,
            last: None,
        }
    }

    /// The work ended: the bar goes.
    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

impl Watch for Reporter {
    fn started(&mut self, job: &JobInfo) {
        let (id, what) = (job.id, &job.what);
        match (&self.bar, &mut self.lines) {
            (Some(b), _) => b.println(format!(
                "job {id}: {what} (Ctrl-C detaches; the server goes on: 'strata jobs')"
            )),
            (None, Some(name)) => {
                eprintln!(
                    "job {id}: {what}: started ('strata jobs' shows it, 'strata jobs cancel \
                     {id}' stops it)"
                );
                *name = format!("job {id}: {what}");
            }
            (None, None) if std::io::stderr().is_terminal() => {
                eprintln!("job {id}: {what} (the server goes on if this ends: 'strata jobs')")
            }
            (None, None) => {}
        }
    }

    fn progress(&mut self, done: u64, total: u64) {
        if let Some(b) = &self.bar {
            b.set_length(total);
            b.set_position(done);
        }
        let Some(name) = &self.lines else { return };
        let tenth = (done * 10).checked_div(total).unwrap_or(0).min(10);
        if tenth <= self.tenth || self.last.is_some_and(|t| t.elapsed() < LINE_EVERY) {
            return;
        }
        let (percent, of) = (
            done * 100 / total,
            match self.bytes {
                true => format!(" ({} of {})", human(done), human(total)),
                false => String::new(),
            },
        );
        eprintln!("{name}: {percent} %{of}");
        self.tenth = tenth;
        self.last = Some(Instant::now());
    }
}
