//! Condition helpers following the Kubernetes API conventions: one condition per `type`,
//! `lastTransitionTime` kept unless the status flips, `observedGeneration` on each.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition status values.
pub const TRUE: &str = "True";
pub const FALSE: &str = "False";
pub const UNKNOWN: &str = "Unknown";

/// A desired condition, before timestamps are applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired<'a> {
    pub type_: &'a str,
    pub status: &'a str,
    /// CamelCase, stable: it is also the Event reason and a metric label.
    pub reason: &'a str,
    /// One sentence for a human.
    pub message: String,
}

/// Sets `desired` in `conditions`. Returns whether anything a reader would notice changed.
/// The transition time moves only when the status flips (or the condition is new).
pub fn set(
    conditions: &mut Vec<Condition>,
    desired: Desired<'_>,
    observed_generation: Option<i64>,
    now: &Time,
) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == desired.type_) {
        Some(existing) => {
            let flipped = existing.status != desired.status;
            let changed = flipped
                || existing.reason != desired.reason
                || existing.message != desired.message
                || existing.observed_generation != observed_generation;
            if flipped {
                existing.last_transition_time = now.clone();
            }
            existing.status = desired.status.to_owned();
            existing.reason = desired.reason.to_owned();
            existing.message = desired.message;
            existing.observed_generation = observed_generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: desired.type_.to_owned(),
                status: desired.status.to_owned(),
                reason: desired.reason.to_owned(),
                message: desired.message,
                last_transition_time: now.clone(),
                observed_generation,
            });
            true
        }
    }
}

/// The condition of `type_`, if present.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is present and `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == TRUE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    fn desired(status: &'static str, reason: &'static str, message: &str) -> Desired<'static> {
        Desired {
            type_: "Ready",
            status,
            reason,
            message: message.to_owned(),
        }
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        struct Case {
            name: &'static str,
            second: Desired<'static>,
            generation: Option<i64>,
            want_changed: bool,
            want_time: i64,
        }
        let cases = [
            Case {
                name: "identical",
                second: desired(UNKNOWN, "Pending", "waiting"),
                generation: Some(1),
                want_changed: false,
                want_time: 10,
            },
            Case {
                name: "new reason",
                second: desired(UNKNOWN, "Claiming", "waiting"),
                generation: Some(1),
                want_changed: true,
                want_time: 10,
            },
            Case {
                name: "new message",
                second: desired(UNKNOWN, "Pending", "still waiting"),
                generation: Some(1),
                want_changed: true,
                want_time: 10,
            },
            Case {
                name: "new generation",
                second: desired(UNKNOWN, "Pending", "waiting"),
                generation: Some(2),
                want_changed: true,
                want_time: 10,
            },
            Case {
                name: "flip",
                second: desired(TRUE, "Ready", "ready"),
                generation: Some(1),
                want_changed: true,
                want_time: 20,
            },
        ];
        for case in cases {
            let mut conditions = Vec::new();
            assert!(
                set(
                    &mut conditions,
                    desired(UNKNOWN, "Pending", "waiting"),
                    Some(1),
                    &at(10)
                ),
                "{}: first set is a change",
                case.name
            );
            let changed = set(
                &mut conditions,
                case.second.clone(),
                case.generation,
                &at(20),
            );
            assert_eq!(changed, case.want_changed, "{}", case.name);
            assert_eq!(conditions.len(), 1, "{}: one condition per type", case.name);
            assert_eq!(
                conditions[0].last_transition_time,
                at(case.want_time),
                "{}",
                case.name
            );
            assert_eq!(conditions[0].reason, case.second.reason, "{}", case.name);
            assert_eq!(
                conditions[0].observed_generation, case.generation,
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn types_are_kept_apart() {
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            Desired {
                type_: "Ready",
                status: FALSE,
                reason: "Claiming",
                message: "m".into(),
            },
            None,
            &at(1),
        );
        set(
            &mut conditions,
            Desired {
                type_: "SandboxReady",
                status: TRUE,
                reason: "ClaimReady",
                message: "m".into(),
            },
            None,
            &at(2),
        );
        assert!(!is_true(&conditions, "Ready"));
        assert!(is_true(&conditions, "SandboxReady"));
        assert!(get(&conditions, "StateDurable").is_none());
        assert_eq!(conditions.len(), 2);
    }
}
