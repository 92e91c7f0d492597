// Package tests holds the family's cross-backend tests: patterns on real
// backends, fault injection, fuzzing of name mapping, and the release
// tests (TestRelease installs a release as a user would; TestCleanTree
// checks that ordinary go commands leave a fresh clone clean). It is a
// module of its own so its test-only dependencies never reach users.
package tests
