//! Reading the apiserver's answers by status code, in one place: what a `kube::Error` says, and
//! whether asking again may get another answer. Decisions are made on codes, never on error
//! text.

/// HTTP 404: the object (or the resource) is not there.
pub const NOT_FOUND: u16 = 404;

/// HTTP 409: the object changed since it was read (or a webhook said so: see the engine).
pub const CONFLICT: u16 = 409;

/// HTTP 429: the apiserver asks to slow down (API Priority and Fairness, a storage still
/// initialising).
pub const TOO_MANY_REQUESTS: u16 = 429;

/// The status code of `error`, when the apiserver answered.
pub fn code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Whether `error` is the apiserver answering 404.
pub fn is_not_found(error: &kube::Error) -> bool {
    code(error) == Some(NOT_FOUND)
}

/// Whether `error` is the apiserver answering 409.
pub fn is_conflict(error: &kube::Error) -> bool {
    code(error) == Some(CONFLICT)
}

/// Whether asking again later may get another answer: no answer at all, throttling (429), or a
/// server error (5xx). Any other answer is the apiserver's word on the request.
pub fn is_transient(error: &kube::Error) -> bool {
    code(error).is_none_or(is_transient_code)
}

/// Whether an answer with status `code` may be different if asked again: 429 and 5xx.
pub fn is_transient_code(code: u16) -> bool {
    code == TOO_MANY_REQUESTS || (500..600).contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: u16) -> kube::Error {
        kube::Error::Api(kube::core::Status { code, ..kube::core::Status::default() }.boxed())
    }

    #[test]
    fn codes_are_read_from_the_answer_and_none_when_there_was_none() {
        assert_eq!(code(&answer(404)), Some(404));
        assert!(is_not_found(&answer(404)) && !is_not_found(&answer(409)));
        assert!(is_conflict(&answer(409)) && !is_conflict(&answer(404)));
        let none = kube::Error::LinesCodecMaxLineLengthExceeded;
        assert_eq!(code(&none), None);
    }

    #[test]
    fn throttling_server_errors_and_no_answer_are_transient_other_answers_final() {
        for transient in [429, 500, 503, 504] {
            assert!(is_transient(&answer(transient)), "{transient}");
        }
        for final_ in [400, 403, 404, 409, 422] {
            assert!(!is_transient(&answer(final_)), "{final_}");
        }
        assert!(is_transient(&kube::Error::LinesCodecMaxLineLengthExceeded));
    }
}
