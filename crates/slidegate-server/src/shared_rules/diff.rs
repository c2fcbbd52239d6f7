//! What a new rules document changes, for the audit trail: each rule added, removed or changed
//! (old → new), and the inline bounds.

use slidegate::{Algorithm, Quota};

use crate::config::{Rule, Rules};
use crate::inline::InlineConfig;

/// The changes from `old` to `new`, one line each: `+ name: …`, `- name: …`,
/// `name: old → new`, `[inline]: old → new`.
pub(super) fn changes(old: (&Rules, &InlineConfig), new: (&Rules, &InlineConfig)) -> Vec<String> {
    let mut lines = Vec::new();
    for rule in old.0.iter() {
        match new.0.get(&rule.name) {
            None => lines.push(format!("- {}: {}", rule.name, describe(rule))),
            Some(now) if now != rule => lines.push(format!("{}: {} → {}", rule.name, describe(rule), describe(now))),
            Some(_) => {}
        }
    }
    for rule in new.0.iter().filter(|r| old.0.get(&r.name).is_none()) {
        lines.push(format!("+ {}: {}", rule.name, describe(rule)));
    }
    if old.1 != new.1 {
        lines.push(format!("[inline]: {:?} → {:?}", old.1, new.1));
    }
    lines
}

/// `5 per 1m sliding_log`, then its tiers and failure policy.
fn describe(rule: &Rule) -> String {
    let mut text = quota(&rule.quota);
    for (name, q) in &rule.tiers {
        text.push_str(&format!(", tier {name} {}", quota(q)));
    }
    if let Some(policy) = rule.quota.failure_policy() {
        text.push_str(&format!(", {}", policy.as_str()));
    }
    text
}

fn quota(q: &Quota) -> String {
    let mut text = format!("{} per {} {}", q.limit(), humantime::format_duration(q.window()), q.algorithm().as_str());
    match q.algorithm() {
        Algorithm::SlidingWindow { buckets } => text.push_str(&format!(" ({buckets} buckets)")),
        Algorithm::Gcra { burst: Some(b) } => text.push_str(&format!(" (burst {b})")),
        _ => {}
    }
    if let Some(w) = q.warm_up() {
        let cold = w.cold_permille() as f64 / 1000.0;
        text.push_str(&format!(" warming up over {} from {cold}", humantime::format_duration(w.period())));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn rules(text: &str) -> Config {
        Config::parse(text, "rules.toml").expect("valid")
    }

    #[test]
    fn each_change_is_one_line_old_then_new() {
        let old = rules(
            "[[rules]]\nname = \"sms\"\nlimit = 5\nwindow = \"1m\"\n\n[[rules]]\nname = \"gone\"\nlimit = 1\nwindow = \"1s\"\n",
        );
        let new = rules(
            "[[rules]]\nname = \"sms\"\nlimit = 10\nwindow = \"1m\"\n\n[[rules]]\nname = \"api\"\nlimit = 100\nwindow = \"1m\"\nalgorithm = \"gcra\"\nburst = 20\ntiers = { vip = { limit = 1000 } }\n\n[inline]\nenabled = false\n",
        );
        let lines = changes((&old.rules, &old.inline), (&new.rules, &new.inline));
        assert_eq!(lines[0], "- gone: 1 per 1s sliding_log");
        assert_eq!(lines[1], "sms: 5 per 1m sliding_log → 10 per 1m sliding_log");
        assert_eq!(lines[2], "+ api: 100 per 1m gcra (burst 20), tier vip 1000 per 1m gcra (burst 20)");
        assert!(lines[3].starts_with("[inline]: InlineConfig { enabled: true"), "{}", lines[3]);
        assert_eq!(lines.len(), 4);
        assert!(changes((&new.rules, &new.inline), (&new.rules, &new.inline)).is_empty());
    }
}
