//! Signal names as a job spec writes them (`kill_signal = "SIGTERM"`).
//!
//! Only the name is checked here; turning it into a number for the OS is the driver's job.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

macro_rules! signals {
    ($($variant:ident = $name:literal, $number:literal, $description:literal,)*) => {
        /// A POSIX signal a task may be sent, by its conventional name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(missing_docs)]
        pub enum Signal { $($variant,)* }

        impl Signal {
            /// Every signal, in declaration order.
            pub const ALL: &'static [Signal] = &[$(Signal::$variant,)*];

            /// The name with its `SIG` prefix, such as `"SIGTERM"`.
            pub fn name(self) -> &'static str {
                match self { $(Signal::$variant => $name,)* }
            }

            /// What the signal means in words, as the C library and Go name it (`SIGINT` is
            /// "interrupt"); Nomad's task events use these.
            pub fn description(self) -> &'static str {
                match self { $(Signal::$variant => $description,)* }
            }

            /// The signal's number on Linux.
            pub fn number(self) -> i32 {
                match self { $(Signal::$variant => $number,)* }
            }

            /// The signal with this number on Linux, if it is one of [`Signal::ALL`].
            pub fn from_number(number: i32) -> Option<Signal> {
                match number { $($number => Some(Signal::$variant),)* _ => None }
            }
        }
    };
}

signals! {
    Hup = "SIGHUP", 1, "hangup",
    Int = "SIGINT", 2, "interrupt",
    Quit = "SIGQUIT", 3, "quit",
    Abrt = "SIGABRT", 6, "aborted",
    Kill = "SIGKILL", 9, "killed",
    Usr1 = "SIGUSR1", 10, "user defined signal 1",
    Usr2 = "SIGUSR2", 12, "user defined signal 2",
    Pipe = "SIGPIPE", 13, "broken pipe",
    Alrm = "SIGALRM", 14, "alarm clock",
    Term = "SIGTERM", 15, "terminated",
    Cont = "SIGCONT", 18, "continued",
    Stop = "SIGSTOP", 19, "stopped (signal)",
    Tstp = "SIGTSTP", 20, "stopped",
    Ttin = "SIGTTIN", 21, "stopped (tty input)",
    Ttou = "SIGTTOU", 22, "stopped (tty output)",
    Winch = "SIGWINCH", 28, "window changed",
}

/// A signal name that is not one of [`Signal::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown signal {0:?}; expected a name such as \"SIGTERM\" or \"SIGINT\"")]
pub struct UnknownSignal(pub String);

impl FromStr for Signal {
    type Err = UnknownSignal;

    /// Accepts `"SIGTERM"`, `"TERM"` and any letter case.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let upper = input.trim().to_ascii_uppercase();
        let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
        Signal::ALL
            .iter()
            .copied()
            .find(|s| &s.name()[3..] == bare)
            .ok_or_else(|| UnknownSignal(input.to_owned()))
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Signal {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_short_forms_parse() {
        for &signal in Signal::ALL {
            assert_eq!(signal.name().parse(), Ok(signal));
            assert_eq!(signal.name()[3..].to_lowercase().parse(), Ok(signal));
        }
        assert_eq!("sigterm".parse(), Ok(Signal::Term));
        for &signal in Signal::ALL {
            assert_eq!(Signal::from_number(signal.number()), Some(signal));
        }
        assert_eq!((Signal::Term.number(), Signal::Kill.number()), (15, 9));
        assert_eq!(Signal::from_number(64), None);
        assert_eq!(
            (Signal::Int.description(), Signal::Term.description()),
            ("interrupt", "terminated")
        );
        assert_eq!("SIGTERMX".parse::<Signal>(), Err(UnknownSignal("SIGTERMX".into())));
        assert!("".parse::<Signal>().is_err());
        assert!("SIG".parse::<Signal>().is_err());
    }
}
