//! "Copy as CLI": the `aqgate admin …` command line that does what a console action does,
//! each argument shell-quoted (POSIX sh: a word of plain characters as it is, anything else
//! in single quotes, an embedded single quote as `'\''`). The page shows it in a `<code>`
//! element, escaped by the template, beside a Copy button (`data-copy`, handled by
//! `console.js`).

/// `arg` as one word of a POSIX shell.
pub(crate) fn quote(arg: &str) -> String {
    let plain =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':' | '@' | '%' | '+' | ',' | '=');
    if !arg.is_empty() && arg.chars().all(plain) {
        return arg.to_string();
    }
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// `aqgate admin` and `args`, each quoted.
pub(crate) fn admin<S: AsRef<str>>(args: &[S]) -> String {
    let mut line = String::from("aqgate admin");
    for a in args {
        line.push(' ');
        line.push_str(&quote(a.as_ref()));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_words_stay_and_the_rest_is_single_quoted() {
        assert_eq!(quote("AQUSER.RAW_QUE"), "AQUSER.RAW_QUE");
        assert_eq!(quote("--max"), "--max");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("AQUSER.AQ$_RAW_TAB_E"), "'AQUSER.AQ$_RAW_TAB_E'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("a b;rm -rf /`x`\n"), "'a b;rm -rf /`x`\n'");
        assert_eq!(admin(&["jobs", "--disable", "COPY_JOB"]), "aqgate admin jobs --disable COPY_JOB");
    }
}
