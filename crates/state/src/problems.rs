//! What validation found wrong with a spec: every problem, each naming its field.

use std::fmt;

/// A job spec that could not be read or is not valid. Each problem names its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecError {
    /// What is wrong, one entry per problem, in the order found.
    pub problems: Vec<FieldProblem>,
}

/// One problem with one field of a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem {
    /// Where it is, such as `group.task[1].name`; empty for the document as a whole.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            if p.field.is_empty() {
                f.write_str(&p.message)?;
            } else {
                write!(f, "{}: {}", p.field, p.message)?;
            }
        }
        Ok(())
    }
}

#[derive(Default)]
pub(crate) struct Problems(Vec<FieldProblem>);

impl Problems {
    pub(crate) fn add(&mut self, field: &str, message: String) {
        self.0.push(FieldProblem { field: field.to_owned(), message });
    }

    pub(crate) fn into_result(self) -> Result<(), SpecError> {
        if self.0.is_empty() { Ok(()) } else { Err(SpecError { problems: self.0 }) }
    }
}
