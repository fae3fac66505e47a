//! The command line of the Manager-path benches: `BIN [OUT.json] [--name value]...`.
//! A value that does not parse ends the bench with the option named (exit 2), never a
//! silent default.
//! Each bench uses the methods it needs.
#![allow(dead_code)]

pub struct Args(Vec<String>);

impl Args {
    pub fn from_env() -> Self {
        Self(std::env::args().collect())
    }

    /// The JSON output path: the first argument unless it is an option, else `default`.
    pub fn out(&self, default: &str) -> String {
        self.0
            .get(1)
            .filter(|a| !a.starts_with("--"))
            .cloned()
            .unwrap_or_else(|| default.into())
    }

    /// The value after `--name`, if given.
    pub fn value(&self, name: &str) -> Option<&str> {
        let i = self.0.iter().position(|a| a == name)?;
        match self.0.get(i + 1) {
            Some(v) => Some(v),
            None => exit(&format!("{name} needs a value")),
        }
    }

    /// Whether the flag `--name` (no value) is given.
    pub fn flag(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }

    /// The whole number after `--name`, or `default` when the option is absent.
    pub fn usize(&self, name: &str, default: usize) -> usize {
        self.value(name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| exit(&format!("{name}: {v:?} is not a whole number")))
        })
    }
}

fn exit(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(2)
}

#[cfg(test)]
mod tests {
    use super::Args;

    fn args(a: &[&str]) -> Args {
        Args(a.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn out_is_the_first_argument_unless_an_option() {
        assert_eq!(args(&["b", "x.json", "--trials", "3"]).out("d.json"), "x.json");
        assert_eq!(args(&["b", "--trials", "3"]).out("d.json"), "d.json");
    }

    #[test]
    fn options_with_defaults() {
        let a = args(&["b", "--trials", "3", "--mode", "on"]);
        assert_eq!(a.usize("--trials", 9), 3);
        assert_eq!(a.usize("--total-mib", 256), 256);
        assert_eq!(a.value("--mode"), Some("on"));
        assert_eq!(a.value("--other"), None);
        assert!(a.flag("--mode") && !a.flag("--decoy-peer"));
    }
}
