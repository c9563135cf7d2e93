package nilcheck

import (
	"io"
	"strings"
	"testing"
)

func TestIsNil(t *testing.T) {
	var nilReader *strings.Reader
	var nilFunc func()
	cases := []struct {
		name string
		v    any
		want bool
	}{
		{"untyped nil", nil, true},
		{"nil pointer in an interface", io.Reader(nilReader), true},
		{"nil func", nilFunc, true},
		{"nil map", map[string]int(nil), true},
		{"pointer", strings.NewReader(""), false},
		{"value", 0, false},
		{"empty struct", struct{}{}, false},
	}
	for _, c := range cases {
		if got := IsNil(c.v); got != c.want {
			t.Errorf("%s: IsNil = %v, want %v", c.name, got, c.want)
		}
	}
}
