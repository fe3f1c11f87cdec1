//go:build with_cgo

package main

// Linked with the C library (external linking): the runtime keeps the
// goroutine pointer in a TLS variable of the program's own TLS block
// (`runtime.tlsg`), not at the fixed -8 from the thread pointer that a
// pure Go program uses.

import "C"
