// Package tests holds the family's cross-backend tests: patterns on real
// backends, fault injection, fuzzing of name mapping. It is a module of its
// own so its test-only dependencies never reach users.
package tests
