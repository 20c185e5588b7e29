//! The progress of `backfill` and `restore`: a bar with rate and ETA when stderr is a terminal,
//! the periodic progress lines otherwise (a pipe, a file, a journal) and with `--log-format
//! json`, so that what scripts and log collectors read is unchanged. The final line (finished,
//! stopped, failed) is printed either way.

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the bar takes a new sample.
const BAR_SAMPLE: Duration = Duration::from_millis(250);

/// What a command reports: its progress line, and where it is for the bar.
pub trait Report: Send + Sync + 'static {
    /// The progress line, `what` saying how far (`in progress`, `finished`, …).
    fn line(&self, what: &str) -> String;
    /// Done so far and the total if known, in [`Report::unit`]s.
    fn position(&self) -> (u64, Option<u64>);
    /// What [`Report::position`] counts (`rows`, `WAL bytes`).
    fn unit(&self) -> &'static str;
    /// A short note beside the bar (published, skipped, …).
    fn note(&self) -> String;
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A progress bar on stderr.
    Bar,
    /// A progress line every interval.
    Lines,
}

impl Mode {
    /// The bar only where a person watches: stderr is a terminal and the log is not JSON.
    pub fn choose(stderr_is_terminal: bool, log_json: bool) -> Self {
        if stderr_is_terminal && !log_json {
            Mode::Bar
        } else {
            Mode::Lines
        }
    }

    /// [`Mode::choose`] for this process's stderr.
    pub fn for_stderr(log_json: bool) -> Self {
        Self::choose(std::io::stderr().is_terminal(), log_json)
    }
}

/// Where the lines go: stderr for the commands, the log for the relay's own backfill.
pub type Say = Arc<dyn Fn(&str) + Send + Sync>;

/// Lines on stderr.
pub fn stderr() -> Say {
    Arc::new(|line: &str| eprintln!("{line}"))
}

/// A running progress display; [`Ticker::finish`] ends it with the final line.
#[allow(missing_debug_implementations)] // holds a progress bar and a task
pub struct Ticker {
    report: Arc<dyn Report>,
    bar: Option<ProgressBar>,
    say: Say,
    ticker: tokio::task::JoinHandle<()>,
}

impl Ticker {
    /// Starts showing `report`: in lines every `every` (at least 100 ms; the first after one
    /// interval) through `say`, or as a bar.
    pub fn start(mode: Mode, every: Duration, report: Arc<dyn Report>, say: Say) -> Self {
        let bar = (mode == Mode::Bar).then(|| new_bar(report.as_ref()));
        let ticker = match &bar {
            Some(bar) => {
                let (bar, report) = (bar.clone(), report.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(BAR_SAMPLE);
                    loop {
                        tick.tick().await;
                        update(&bar, report.as_ref());
                    }
                })
            }
            None => {
                let (say, report) = (say.clone(), report.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
                    tick.tick().await;
                    loop {
                        tick.tick().await;
                        say(&report.line("in progress"));
                    }
                })
            }
        };
        Ticker {
            report,
            bar,
            say,
            ticker,
        }
    }

    /// Stops the display and prints the final line, `what` saying how it ended.
    pub fn finish(&self, what: &str) {
        self.ticker.abort();
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        (self.say)(&self.report.line(what));
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.ticker.abort();
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn new_bar(report: &dyn Report) -> ProgressBar {
    let unit = report.unit();
    let (_, total) = report.position();
    // Fixed-width parts first; the note takes what is left of the line and is cut to fit.
    let template = if total.is_some() {
        format!(
            "{{spinner}} {{elapsed_precise}} [{{bar:25}}] {{human_pos}}/{{human_len}} {unit} ({{percent}}%, {{rate}}, ETA {{eta}}) {{wide_msg}}"
        )
    } else {
        format!("{{spinner}} {{elapsed_precise}} {{human_pos}} {unit} ({{rate}}) {{wide_msg}}")
    };
    let style = ProgressStyle::with_template(&template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key(
            "rate",
            |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.0}/s", state.per_sec());
            },
        )
        .progress_chars("=> ");
    let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr()).with_style(style);
    update(&bar, report);
    bar
}

fn update(bar: &ProgressBar, report: &dyn Report) {
    let (done, total) = report.position();
    if let Some(total) = total {
        bar.set_length(total.max(done));
    }
    bar.set_position(done);
    bar.set_message(report.note());
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn a_bar_only_on_a_terminal_and_not_with_json_logs() {
        assert_eq!(Mode::choose(true, false), Mode::Bar);
        assert_eq!(Mode::choose(false, false), Mode::Lines);
        assert_eq!(Mode::choose(true, true), Mode::Lines);
        assert_eq!(Mode::choose(false, true), Mode::Lines);
    }

    struct Counting(AtomicU64);

    impl Report for Counting {
        fn line(&self, what: &str) -> String {
            format!(
                "job {what}: {} rows done",
                self.0.fetch_add(1, Ordering::Relaxed)
            )
        }
        fn position(&self) -> (u64, Option<u64>) {
            (self.0.load(Ordering::Relaxed), Some(100))
        }
        fn unit(&self) -> &'static str {
            "rows"
        }
        fn note(&self) -> String {
            "note".into()
        }
    }

    /// Not on a terminal: exactly the report's lines, each an interval apart, then the final
    /// one; no bar, nothing else.
    #[tokio::test(start_paused = true)]
    async fn lines_are_the_reports_lines_unchanged() {
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let say: Say = {
            let seen = seen.clone();
            Arc::new(move |line: &str| seen.lock().unwrap().push(line.to_owned()))
        };
        let report = Arc::new(Counting(AtomicU64::new(0)));
        let progress = Ticker::start(
            Mode::choose(false, false),
            Duration::from_secs(5),
            report,
            say,
        );
        assert!(progress.bar.is_none());
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        progress.finish("finished");
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "job in progress: 0 rows done",
                "job in progress: 1 rows done",
                "job finished: 2 rows done",
            ]
        );
    }
}
