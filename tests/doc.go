// Package tests holds the family's cross-backend tests: patterns on real
// backends, fault injection, fuzzing of name mapping, and the release test
// (TestRelease installs a release as a user would). It is a module of its
// own so its test-only dependencies never reach users.
package tests
