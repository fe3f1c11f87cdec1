//go:build with_cgo

package main

// Linked with the C library (external linking): the runtime keeps the
// goroutine pointer in a TLS variable of the program's own TLS block
// (`runtime.tlsg`), not at the fixed -8 from the thread pointer that a
// pure Go program uses. A C thread-local beside it makes the block bigger
// than the pointer alone, so that the pointer is not at -8 either.

/*
__thread long cgo_tls_neighbour[8];
static long touch_tls_neighbour(void) { return ++cgo_tls_neighbour[7]; }
*/
import "C"

func init() {
	C.touch_tls_neighbour()
}
