//! Commands that end at their deadline wherever they run, even when the prober that started
//! them is gone: a command outlives the process (or the connection) that ran it by a bounded
//! time, which is what lets a scheduler that takes over judge a start its predecessor left in
//! flight. Used by [`SshExecutor`](crate::SshExecutor) on the worker and by
//! [`LocalExecutor`](crate::LocalExecutor) on this host.

use crate::quote::quote;
use std::time::Duration;

/// `command` under a deadline `left` from now, enforced where it runs: `timeout` (coreutils or
/// busybox) sends TERM to the command's whole process group at the deadline (rounded up to a
/// second) and KILL a second later. On a worker without `timeout` the command runs as it is. A
/// simple command (the run probe, a start, a kill) is run by `timeout` itself; anything else
/// through `sh -c`, which costs the worker one more program per command.
pub(crate) fn under_deadline(command: &str, left: Duration) -> String {
    let Ok(quoted) = quote("command", command) else { return command.to_owned() };
    let seconds = timeout_seconds(left);
    let guarded =
        if runs_without_a_shell(command) { command.to_owned() } else { format!("sh -c {quoted}") };
    format!(
        "if command -v timeout >/dev/null 2>&1; then exec timeout -k 1 {seconds} {guarded}; \
         else exec sh -c {quoted}; fi"
    )
}

/// The arguments of `timeout` that run `command` under a deadline `left` from now, as
/// [`under_deadline`] does, for a caller that starts `timeout` itself: `None` when the command
/// needs a shell. Single-quoted words lose their quotes, as a shell would take them off.
pub(crate) fn timeout_args(command: &str, left: Duration) -> Option<Vec<String>> {
    if !runs_without_a_shell(command) {
        return None;
    }
    let mut args = vec!["-k".to_owned(), "1".to_owned(), timeout_seconds(left).to_string()];
    for word in command.split(' ') {
        let unquoted = word.strip_prefix('\'').and_then(|w| w.strip_suffix('\'')).unwrap_or(word);
        args.push(unquoted.to_owned());
    }
    Some(args)
}

/// The whole seconds `timeout` is given for a deadline `left` from now: rounded up, at least 1.
fn timeout_seconds(left: Duration) -> u64 {
    (left.as_secs() + u64::from(left.subsec_nanos() > 0)).max(1)
}

/// Whether `command` means the same when `timeout` runs it as when a shell does: one simple
/// command of plain or single-quoted words, led by a program rather than a shell keyword, a
/// builtin or a variable assignment. Anything else (operators, expansions, redirections, a
/// quote inside a word) is left to a shell.
fn runs_without_a_shell(command: &str) -> bool {
    /// Words a shell runs itself, or differently from the program of that name.
    const SHELL_WORDS: &[&str] = &[
        "!", "{", "}", "[[", "]]", "case", "do", "done", "elif", "else", "esac", "fi", "for",
        "function", "if", "in", "select", "then", "until", "while", ".", ":", "alias", "bg",
        "break", "builtin", "cd", "command", "continue", "declare", "echo", "eval", "exec", "exit",
        "export", "fc", "fg", "getopts", "hash", "jobs", "kill", "let", "local", "printf", "pwd",
        "read", "readonly", "return", "set", "shift", "source", "test", "[", "times", "trap",
        "type", "typeset", "ulimit", "umask", "unalias", "unset", "wait",
    ];
    let plain = |word: &str| {
        !word.is_empty()
            && word.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(&b))
    };
    let single_quoted = |word: &str| {
        word.len() >= 2
            && word.starts_with('\'')
            && word.ends_with('\'')
            && !word[1..word.len() - 1].contains('\'')
    };
    let mut words = command.split(' ');
    let Some(first) = words.next() else { return false };
    let program = (plain(first) && !first.contains('=') && !SHELL_WORDS.contains(&first))
        || (single_quoted(first) && first.contains('/'));
    program && words.all(|word| plain(word) || single_quoted(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_commands_timeout_runs_without_a_shell() {
        let cases = [
            ("wharf alloc list --probe", true),
            ("sudo wharf alloc stop --wait 1s job-1", true),
            ("'/var/lib/wharf-runner/runner~0a1b' --list", true),
            ("sha256sum '/var/lib/wharf-runner/runner~0a1b'", true),
            ("systemctl is-system-running", true),
            ("crunch-run --kill 15 'zzzzz-dz642-x'", true),
            ("test -d /", false),
            ("exit 0", false),
            ("echo ok", false),
            ("cd /tmp", false),
            ("A=1 wharf alloc list", false),
            ("'cd' /", false),
            ("true; reboot", false),
            ("cat a | wc -l", false),
            ("sleep 600 & wait", false),
            ("echo $HOME", false),
            ("printf '%s' x", false),
            ("wharf 'it'\\''s'", false),
            ("wharf  alloc", false),
            ("wharf > out", false),
            ("", false),
        ];
        for (command, direct) in cases {
            assert_eq!(runs_without_a_shell(command), direct, "{command:?}");
        }
    }

    #[test]
    fn a_simple_command_gets_timeout_args_and_others_need_the_shell() {
        let in_20s = Duration::from_millis(19_500);
        let args = timeout_args("'/var/lib/wharf-runner/runner~0a1b' run --id 'job-1'", in_20s);
        let expected =
            ["-k", "1", "20", "/var/lib/wharf-runner/runner~0a1b", "run", "--id", "job-1"];
        assert_eq!(args.unwrap(), expected);
        assert_eq!(timeout_args("echo $HOME", in_20s), None);
        assert_eq!(timeout_args("true; reboot", in_20s), None);
    }

    #[test]
    fn the_deadline_wraps_every_command() {
        let in_20s = Duration::from_millis(19_500);
        let direct = under_deadline("wharf alloc list --probe", in_20s);
        assert_eq!(
            direct,
            "if command -v timeout >/dev/null 2>&1; then exec timeout -k 1 20 wharf alloc list \
             --probe; else exec sh -c 'wharf alloc list --probe'; fi"
        );
        let shell = under_deadline("true; echo x", in_20s);
        assert!(shell.contains("exec timeout -k 1 20 sh -c 'true; echo x';"), "{shell}");
        assert!(under_deadline("wharf", Duration::ZERO).contains("timeout -k 1 1 wharf"));
    }
}
