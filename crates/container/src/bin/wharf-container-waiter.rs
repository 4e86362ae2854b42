fn main() {
    wharf_container::waiter::run_if_invoked();
    // Started without the flag: say what this program is for.
    std::process::exit(2)
}
