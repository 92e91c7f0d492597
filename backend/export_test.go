package backend

// UnescapeForTest is unescape, for the external tests.
var UnescapeForTest = unescape
