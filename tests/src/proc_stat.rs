//! What the tests and the bench read of a process in its `/proc/<pid>/stat` (proc(5)): its
//! name, state, parent, process group and session, and its CPU time. The command name may hold
//! spaces and parentheses, so the fields are counted from its last `)`. And [`pids`], the
//! processes there are.

use std::fmt::Display;
use std::path::Path;

/// The fields of a `/proc/<pid>/stat` (or of one thread's, `/proc/<pid>/task/<tid>/stat`)
/// that the tests use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// Its command name (`comm`: the program's file name, cut to 15 bytes).
    pub name: String,
    /// R, S, D, T, t, Z, X, ...
    pub state: char,
    /// The parent's pid.
    pub parent: i32,
    /// The process group.
    pub group: i32,
    /// The session.
    pub session: i32,
    /// Its own CPU time, user and system, in clock ticks.
    pub cpu_ticks: u64,
    /// The CPU time of the children it waited for, user and system, in clock ticks.
    pub reaped_children_ticks: u64,
    /// When it started, in clock ticks since boot.
    pub start_ticks: u64,
}

impl ProcStat {
    /// Process `pid`'s; `None` if there is none (or it cannot be read).
    pub fn of(pid: impl Display) -> Option<ProcStat> {
        ProcStat::read(Path::new(&format!("/proc/{pid}/stat")))
    }

    /// The one in the `stat` file at `path`.
    pub fn read(path: &Path) -> Option<ProcStat> {
        ProcStat::parse(&std::fs::read_to_string(path).ok()?)
    }

    /// Parses the text of a `stat` file.
    pub fn parse(text: &str) -> Option<ProcStat> {
        let (opening, closing) = (text.find('(')?, text.rfind(')')?);
        let name = text.get(opening + 1..closing)?.to_owned();
        let rest = &text[closing + 1..];
        let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
        // fields[0] is field 3 of proc(5), the state.
        let field = |number: usize| fields.get(number - 3).copied();
        let int = |number: usize| field(number)?.parse::<i32>().ok();
        let ticks = |number: usize| field(number)?.parse::<u64>().ok();
        // The children's times are signed in proc(5), and never negative in practice.
        let child_ticks = |number: usize| u64::try_from(field(number)?.parse::<i64>().ok()?).ok();
        Some(ProcStat {
            name,
            state: field(3)?.chars().next()?,
            parent: int(4)?,
            group: int(5)?,
            session: int(6)?,
            cpu_ticks: ticks(14)? + ticks(15)?,
            reaped_children_ticks: child_ticks(16)? + child_ticks(17)?,
            start_ticks: ticks(22)?,
        })
    }

    /// Whether it has exited: a zombie its parent has not reaped, or one being reaped.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }

    /// Whether it is stopped (by a signal, or by a tracer).
    pub fn is_stopped(&self) -> bool {
        matches!(self.state, 'T' | 't')
    }
}

/// The pids of the processes there are now (the numbered entries of `/proc`).
pub fn pids() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::ProcStat;

    #[test]
    fn fields_are_counted_from_the_command_names_last_parenthesis() {
        let tail = "S 7 8 9 0 -1 4194560 100 0 0 0 11 12 13 14 20 0 1 0 4242 1000 50";
        for comm in ["sleep", "a b", "x) S 1 2 3 (y", ""] {
            let stat = ProcStat::parse(&format!("42 ({comm}) {tail}")).expect(comm);
            let expected = ProcStat {
                name: comm.to_owned(),
                state: 'S',
                parent: 7,
                group: 8,
                session: 9,
                cpu_ticks: 23,
                reaped_children_ticks: 27,
                start_ticks: 4242,
            };
            assert_eq!(stat, expected, "{comm:?}");
        }
    }

    #[test]
    fn a_line_cut_short_or_garbled_is_none() {
        for garbage in ["", "42", "42 (sleep)", "42 (sleep) S 7 8", "42 (sleep) S x 8 9 0 -1 1"] {
            assert_eq!(ProcStat::parse(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn this_processs_stat_agrees_with_its_own_ids() {
        let me = ProcStat::of(std::process::id()).expect("this process's stat");
        assert!(!me.is_dead() && !me.is_stopped(), "{me:?}");
        // SAFETY: getsid and getppid only read this process's ids.
        let (session, parent) = unsafe { (libc::getsid(0), libc::getppid()) };
        assert_eq!((me.session, me.parent), (session, parent));
        assert!(ProcStat::of("no-such-process").is_none());
        assert!(super::pids().any(|pid| u32::try_from(pid) == Ok(std::process::id())));
    }
}
