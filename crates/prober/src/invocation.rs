//! The one shape of a runner command on a worker: `[sudo ]<program> [<instance's runner
//! args> ]<args>`. The pool's probes, starts and kills, the probe channel's server and the
//! fleet's relay to a worker's agent all build theirs with [`RunnerInvocation`].

use crate::{Instance, Prepared, ProberError};

/// How a worker runs the runner: the program as its commands start with it, and the
/// arguments its instance gives the runner before each command's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerInvocation {
    program: String,
    instance_args: String,
}

impl RunnerInvocation {
    /// The runner `config` names (the deployed binary, or the configured command) as a
    /// worker of `instance` runs it: under `sudo` for a user other than root, with the
    /// instance's runner arguments.
    pub fn of(config: &Prepared, instance: &Instance) -> Result<RunnerInvocation, ProberError> {
        let program = format!("{}{}", sudo(&instance.remote_user), config.runner_program()?);
        Ok(RunnerInvocation::new(program, &instance.runner_args))
    }

    /// `program` (as the commands start with it, `sudo` included) given `instance_args`
    /// (shell words; white space around them is dropped) before each command's own.
    pub fn new(program: impl Into<String>, instance_args: &str) -> RunnerInvocation {
        RunnerInvocation { program: program.into(), instance_args: instance_args.trim().into() }
    }

    /// What every runner command on the worker starts with: `[sudo ]<program>`.
    pub fn program(&self) -> &str {
        &self.program
    }

    /// The command that gives the runner `args` (shell words, already quoted).
    pub fn command(&self, args: &str) -> String {
        let mut command = self.program.clone();
        for words in [self.instance_args.as_str(), args.trim()] {
            if !words.is_empty() {
                command.push(' ');
                command.push_str(words);
            }
        }
        command
    }
}

/// What a privileged command is prefixed with for `remote_user`: nothing for root.
fn sudo(remote_user: &str) -> &'static str {
    if remote_user == "root" { "" } else { "sudo " }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RunnerConfig, WorkerConfig};

    fn instance(remote_user: &str, runner_args: &str) -> Instance {
        Instance {
            remote_user: remote_user.into(),
            runner_args: runner_args.into(),
            ..Instance::new("w1", "192.0.2.1")
        }
    }

    #[test]
    fn a_command_is_the_program_the_instances_arguments_and_its_own() {
        let runner = RunnerConfig { command: "wharf".into(), ..RunnerConfig::default() };
        let config = WorkerConfig { runner, ..WorkerConfig::default() }.prepare().unwrap();
        let cases = [
            ("root", "", "alloc list", "wharf alloc list"),
            ("admin", "", "alloc list", "sudo wharf alloc list"),
            ("root", "  --data-dir /srv/w ", "alloc list", "wharf --data-dir /srv/w alloc list"),
            ("admin", "--data-dir /d", "probe-channel", "sudo wharf --data-dir /d probe-channel"),
        ];
        for (user, instance_args, args, expected) in cases {
            let invocation = RunnerInvocation::of(&config, &instance(user, instance_args)).unwrap();
            assert_eq!(invocation.command(args), expected, "{user} {instance_args:?}");
            let program = if user == "root" { "wharf" } else { "sudo wharf" };
            assert_eq!(invocation.program(), program);
        }
    }
}
