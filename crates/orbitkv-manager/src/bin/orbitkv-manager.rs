//! `orbitkv-manager`: the Manager as a plain binary (the Python package runs
//! the same code through `orbitkv serve`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

fn main() {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("orbitkv-manager: cannot install signal handler: {e}");
            std::process::exit(1);
        }
    }
    std::process::exit(orbitkv_manager::run_until_signal(
        std::env::args().collect(),
        stop,
    ));
}
