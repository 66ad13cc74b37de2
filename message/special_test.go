package message

import (
	"encoding/binary"
	"math/bits"
	"math/rand"
	"testing"
)

// TestSpecial checks the eight-byte scan against a byte-by-byte one: every
// byte value at every position, over plain and random neighbours.
func TestSpecial(t *testing.T) {
	first := func(w [8]byte) int {
		for i, c := range w {
			if !plainByte[c] {
				return i
			}
		}
		return 8
	}
	check := func(w [8]byte) {
		got := 8
		if m := special(binary.LittleEndian.Uint64(w[:])); m != 0 {
			got = bits.TrailingZeros64(m) >> 3
		}
		if want := first(w); got != want {
			t.Fatalf("special(% x) flags byte %d, want %d", w, got, want)
		}
	}
	rng := rand.New(rand.NewSource(1))
	for pos := 0; pos < 8; pos++ {
		for c := 0; c < 256; c++ {
			for n := 0; n < 64; n++ {
				var w [8]byte
				for i := range w {
					switch {
					case n == 0:
						w[i] = 'a'
					case n < 32:
						w[i] = byte(0x20 + rng.Intn(0x60)) // printable, or '"' '\\'
					default:
						w[i] = byte(rng.Intn(256))
					}
				}
				w[pos] = byte(c)
				check(w)
			}
		}
	}
}
