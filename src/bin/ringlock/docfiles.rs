//! `ringlock completions SHELL [--dir DIR]` and `ringlock man [--dir DIR]`:
//! the shell completion script and the man pages, from the same clap
//! definition as the parser. Without `--dir` one file goes to stdout (the
//! completion script; the man page `ringlock.1`). With `--dir`, DIR is
//! created if missing (a fresh home has no `~/.local/share/man/man1`) and the
//! files are written into it under the names their readers look for: the
//! completion script as the shell's completion loader finds it, and
//! `ringlock.1` plus one page per subcommand (`ringlock-lock.1`,
//! `ringlock-cluster-status.1`, ...), the pages `ringlock.1` refers to.
//! Each file written is printed on stdout, one path a line.

use std::path::Path;

use clap::Command;
use clap_complete::Shell;

use crate::exit::Fail;

/// `cert`'s code for a file that cannot be created.
const EX_CANTCREAT: u8 = 73;

/// The file name a shell's completion loader looks for: bash-completion
/// loads `DIR/ringlock` on first use of `ringlock` (every version; clap's
/// `ringlock.bash` only from bash-completion 2.9), zsh `_ringlock` from a
/// folder of `$fpath`, fish `ringlock.fish`.
pub fn completion_file_name(shell: Shell) -> &'static str {
    match shell {
        Shell::Bash => "ringlock",
        Shell::Zsh => "_ringlock",
        Shell::Fish => "ringlock.fish",
        Shell::Elvish => "ringlock.elv",
        Shell::PowerShell => "_ringlock.ps1",
        _ => "ringlock.completion",
    }
}

fn create_dir(what: &str, dir: &Path) -> Result<(), Fail> {
    std::fs::create_dir_all(dir).map_err(|e| {
        Fail(
            EX_CANTCREAT,
            format!("{what}: cannot create the folder {}: {e}", dir.display()),
        )
    })
}

fn write_file(what: &str, path: &Path, bytes: &[u8]) -> Result<(), Fail> {
    std::fs::write(path, bytes)
        .map_err(|e| Fail(EX_CANTCREAT, format!("{what}: {}: {e}", path.display())))
}

/// The completion script for `shell`, on stdout or as a file in `dir`.
pub fn completions(
    mut cmd: Command,
    shell: Shell,
    dir: Option<&Path>,
    out: &dyn Fn(&[u8]),
) -> Result<u8, Fail> {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "ringlock", &mut buf);
    let Some(dir) = dir else {
        out(&buf);
        return Ok(0);
    };
    create_dir("completions", dir)?;
    let path = dir.join(completion_file_name(shell));
    write_file("completions", &path, &buf)?;
    out(path_line(&path).as_slice());
    Ok(0)
}

/// The man pages: `ringlock.1` on stdout, or it and every subcommand's page
/// (hidden ones aside) written into `dir`.
pub fn man(cmd: Command, dir: Option<&Path>, out: &dyn Fn(&[u8])) -> Result<u8, Fail> {
    let mut cmd = cmd;
    // Subcommands get their display names (`ringlock-cluster-status`),
    // which name their pages and the references between them.
    cmd.build();
    let Some(dir) = dir else {
        out(&render(&cmd)?);
        return Ok(0);
    };
    create_dir("man", dir)?;
    let mut pages = Vec::new();
    collect(&cmd, &mut pages);
    let mut written = Vec::new();
    for page in pages {
        let name = page.get_display_name().unwrap_or(page.get_name());
        let path = dir.join(format!("{name}.1"));
        write_file("man", &path, &render(page)?)?;
        written.extend(path_line(&path));
    }
    out(&written);
    Ok(0)
}

/// `cmd` and its visible subcommands, depth first, `cmd` first.
fn collect<'a>(cmd: &'a Command, pages: &mut Vec<&'a Command>) {
    pages.push(cmd);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect(sub, pages);
    }
}

fn render(cmd: &Command) -> Result<Vec<u8>, Fail> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut buf)
        .map_err(|e| {
            Fail(
                crate::exit::EX_SOFTWARE,
                format!("rendering the man page: {e}"),
            )
        })?;
    Ok(buf)
}

fn path_line(path: &Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut line = path.as_os_str().as_bytes().to_vec();
    line.push(b'\n');
    line
}
