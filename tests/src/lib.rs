//! Helpers shared by wharf's end-to-end tests; the tests themselves are in `tests/`.
