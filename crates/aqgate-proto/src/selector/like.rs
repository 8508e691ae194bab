//! `LIKE` patterns: compiled once for a literal pattern, matched per message.

use super::*;

pub(super) fn compile_like(pattern: &str, escape: Option<char>) -> Result<Vec<LikeTok>, String> {
    let mut out = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if Some(c) == escape {
            match chars.next() {
                Some(n) if n == '%' || n == '_' || Some(n) == escape => out.push(LikeTok::Lit(n)),
                Some(n) => {
                    return Err(format!("invalid escape sequence `{c}{n}` in LIKE pattern"));
                }
                None => return Err("LIKE pattern ends with the escape character".into()),
            }
        } else {
            out.push(match c {
                '%' => LikeTok::Many,
                '_' => LikeTok::One,
                c => LikeTok::Lit(c),
            });
        }
    }
    Ok(out)
}

/// Classic wildcard matching with single backtrack point: O(text × pattern)
/// worst case, no recursion.
pub(super) fn like_match(text: &[char], pat: &[LikeTok]) -> bool {
    let (mut t, mut p) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while let Some(&tc) = text.get(t) {
        match pat.get(p) {
            Some(LikeTok::Many) => {
                star = Some((p + 1, t));
                p += 1;
                continue;
            }
            Some(LikeTok::One) => {
                t += 1;
                p += 1;
                continue;
            }
            Some(LikeTok::Lit(c)) if *c == tc => {
                t += 1;
                p += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((sp, st)) => {
                p = sp;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    while pat.get(p) == Some(&LikeTok::Many) {
        p += 1;
    }
    p == pat.len()
}
