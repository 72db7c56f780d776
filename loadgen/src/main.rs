//! `ringlock-loadgen`: see `--help` and docs/loadgen.md.

use ringlock_loadgen::{config, engine, report};

fn main() {
    let cfg = match config::parse_args(std::env::args_os().skip(1)) {
        Ok(c) => c,
        Err(msg) => {
            let help = msg.starts_with("ringlock-loadgen:") || msg == config::VERSION;
            if help {
                print!("{msg}");
                std::process::exit(0);
            }
            eprintln!("error: {msg}");
            std::process::exit(2);
        }
    };
    let stats = match engine::run(&cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    if let Some(path) = &cfg.hgrm_path {
        if let Err(e) = std::fs::write(path, report::to_hgrm(&stats.lock)) {
            eprintln!("error: writing {path}: {e}");
            std::process::exit(1);
        }
    }
    if let Some(path) = &cfg.latency_log {
        if let Err(e) = std::fs::write(path, report::to_latency_log(&stats)) {
            eprintln!("error: writing {path}: {e}");
            std::process::exit(1);
        }
    }
    print!("{}", report::to_text(&cfg, &stats));
    if cfg.json {
        println!("{}", report::to_json(&cfg, &stats));
    }
    if let Some(why) = report::all_failed(&stats) {
        eprintln!("error: {why}");
        std::process::exit(1);
    }
}
