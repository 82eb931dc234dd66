//! How a server's moves run ([`MoveSettings`]: when they mirror, and who
//! is told of each step), apart from `moving` so that `placement`, which
//! carries them in its config, does not import the mover it drives.

use std::sync::Arc;

/// When a move mirrors client writes into its target (`strata serve
/// --move-mirror`, docs/MOVE.md step 7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mirror {
    /// Once the passes stop shrinking (after `moving::PASSES_MIN`) or after
    /// `moving::PASSES_MAX`, unless a pass finds little left first.
    #[default]
    Auto,
    /// After the head's first pass, whatever it left: the move ends
    /// sooner, and clients pay a second write each until the switch.
    Always,
}

impl std::str::FromStr for Mirror {
    type Err = strata_engine::Error;
    fn from_str(s: &str) -> Result<Mirror, Self::Err> {
        match s {
            "auto" => Ok(Mirror::Auto),
            "always" => Ok(Mirror::Always),
            _ => Err(strata_api::units::invalid(format!(
                "'{s}': expected auto or always"
            ))),
        }
    }
}

/// A step of a move, reached with something for a start after a crash
/// there to undo or finish (docs/MOVE.md, "Crash analysis").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveStep {
    /// The head's first pass is copied (step 6; the move is recorded as
    /// copying, the target exists).
    Copied,
    /// The passes converged and the target is flushed (step 7), before
    /// client I/O is held.
    Converged,
    /// Client I/O is held, the last pass copied and the target flushed
    /// (step 8), before the commit point.
    Switching,
    /// Past the commit point, before the source is removed (step 9).
    Switched,
}

impl MoveStep {
    pub const ALL: [MoveStep; 4] = [
        MoveStep::Copied,
        MoveStep::Converged,
        MoveStep::Switching,
        MoveStep::Switched,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MoveStep::Copied => "copied",
            MoveStep::Converged => "converged",
            MoveStep::Switching => "switching",
            MoveStep::Switched => "switched",
        }
    }
}

/// Called with the disk and the step at each step a move reaches, before
/// it goes on (the crash tests abort the process there).
pub type StepHook = Arc<dyn Fn(&str, MoveStep) + Send + Sync>;

/// How a server's moves run.
#[derive(Clone, Default)]
pub struct MoveSettings {
    pub mirror: Mirror,
    /// Told of each step (None: the step is only logged, at debug level).
    pub on_step: Option<StepHook>,
}

impl std::fmt::Debug for MoveSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoveSettings")
            .field("mirror", &self.mirror)
            .field("on_step", &self.on_step.as_ref().map(|_| "hook"))
            .finish()
    }
}

impl MoveSettings {
    pub(crate) fn reached(&self, disk: &str, step: MoveStep) {
        tracing::debug!(disk, step = step.as_str(), "move step");
        if let Some(hook) = &self.on_step {
            hook(disk, step);
        }
    }
}
