package httplimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// proxyAppend is how a proxy adds its element to what the client sent.
type proxyAppend int

const (
	newLine  proxyAppend = iota // a header line of its own
	sameLine                    // ", element" appended to the client's last line
)

// forwardedRequest is a request from the trusted proxy 10.0.0.1 that
// carries the client's own lines with the proxy's element added as mode says.
func forwardedRequest(header string, clientLines []string, element string, mode proxyAppend) *http.Request {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "10.0.0.1:443"
	lines := append([]string(nil), clientLines...)
	if mode == sameLine && len(lines) > 0 {
		lines[len(lines)-1] += ", " + element
	} else {
		lines = append(lines, element)
	}
	for _, line := range lines {
		req.Header.Add(header, line)
	}
	return req
}

// A client's own Forwarded lines, however broken, never change the key: it
// is the address the trusted proxy appended, whether the proxy adds a line
// of its own or appends to the client's.
func TestForwardedClientLinesCannotChooseTheKey(t *testing.T) {
	key := ClientIPBehind(Proxies{Header: "Forwarded", Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	crafted := []string{
		`for=198.51.100.7;x="`,         // the attacker's own address behind an unclosed quote
		`for=192.0.2.66;x="`,           // a victim's
		`for="_attacker";x="`,          // an obfuscated id all attackers share
		`for=unknown;x="`,              // "unknown"
		`x="`,                          // nothing but the quote
		`for=198.51.100.7;x="\`,        // a quote and a dangling escape
		`for=198.51.100.7, x="a\"`,     // an escaped quote that leaves it open
		`for=198.51.100.7;for=1.1.1.1`, // for= twice
		`for=198.51.100.7;`,            // an empty pair
		`for=198.51.100.7,`,            // an empty element
		`for="198.51.100.7`,            // an unclosed value
		`for=198.51.100.7` + "\x00",    // a byte no header holds
	}
	for _, mode := range []proxyAppend{newLine, sameLine} {
		for _, line := range crafted {
			for _, chain := range []struct {
				name     string
				elements []string // the proxies' elements, nearest last
			}{
				{"one proxy", []string{`for=203.0.113.9`}},
				{"one proxy, quoted with a port", []string{`for="203.0.113.9:4711";proto=https`}},
				{"two proxies", []string{`for=203.0.113.9`, `for=10.0.0.7;by=10.0.0.1`}},
			} {
				t.Run(chain.name+"/"+line, func(t *testing.T) {
					req := forwardedRequest("Forwarded", []string{line}, chain.elements[0], mode)
					for _, e := range chain.elements[1:] {
						lines := req.Header.Values("Forwarded")
						if mode == sameLine {
							lines[len(lines)-1] += ", " + e
						} else {
							req.Header.Add("Forwarded", e)
						}
					}
					got, err := key(req)
					require.NoError(t, err, "headers %q", req.Header.Values("Forwarded"))
					assert.Equal(t, "203.0.113.9", got, "headers %q: the key must be the address the trusted proxy saw", req.Header.Values("Forwarded"))
				})
			}
		}
	}
}

// FuzzForwarded checks the spoof property of both list headers: whatever a
// client sends in its own lines, the key is the address the nearest trusted
// proxy saw.
func FuzzForwarded(f *testing.F) {
	for _, seed := range []string{
		`for=198.51.100.7;x="`, `for="_x";y="`, `x="\`, `for=1.1.1.1, for="[2001:db8::1]:80"`,
		`a=b;c="d,e", for=2.2.2.2`, "for=1.1.1.1\nx=\"", `1.1.1.1, 2.2.2.2`, `,,,`, `"`,
	} {
		for form := range uint8(len(proxyElements)) {
			f.Add(seed, form, false)
			f.Add(seed, form, true)
		}
	}
	trusted := Proxies{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	forwarded := trusted
	forwarded.Header = "Forwarded"
	keyForwarded, keyXFF := ClientIPBehind(forwarded), ClientIPBehind(trusted)
	f.Fuzz(func(t *testing.T, client string, form uint8, appendToLine bool) {
		pe := proxyElements[int(form)%len(proxyElements)]
		mode := newLine
		if appendToLine {
			mode = sameLine
		}
		lines := strings.Split(client, "\n")

		req := forwardedRequest("Forwarded", lines, pe.forwarded, mode)
		got, err := keyForwarded(req)
		if err != nil || got != pe.want {
			t.Fatalf("Forwarded %q: key %q, error %v; want %q, the address the trusted proxy saw", req.Header.Values("Forwarded"), got, err, pe.want)
		}
		req = forwardedRequest("X-Forwarded-For", lines, pe.xff, mode)
		got, err = keyXFF(req)
		if err != nil || got != pe.want {
			t.Fatalf("X-Forwarded-For %q: key %q, error %v; want %q, the address the trusted proxy saw", req.Header.Values("X-Forwarded-For"), got, err, pe.want)
		}
	})
}

// proxyElements are ways a proxy writes the client's address.
var proxyElements = []struct{ forwarded, xff, want string }{
	{`for=203.0.113.9`, `203.0.113.9`, "203.0.113.9"},
	{`for="203.0.113.9:4711";proto=https;by=10.0.0.1`, `203.0.113.9:4711`, "203.0.113.9"},
	{`proto=https;For="[2001:db8::9]:4711"`, `[2001:db8::9]:4711`, "2001:db8::9"},
	{`for="[2001:db8::9]"`, `2001:db8::9`, "2001:db8::9"},
	{`for=203.0.113.9;host="example.com"`, ` 203.0.113.9 `, "203.0.113.9"},
}

// End to end: one client behind a trusted proxy sends 1000 requests, each
// with a Forwarded line of its own that claims another address behind an
// unclosed quote. A limit of 5 per hour gives it 5.
func TestForwardedSpoofingEndToEnd(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewFixedWindow(env.Client(), 5, time.Hour, env.Options()...)
	require.NoError(t, err)
	key := ClientIPBehind(Proxies{Header: "Forwarded", Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	h := Middleware(l, WithKeyFunc(key))(ok)
	codes := map[int]int{}
	for i := range 1000 {
		client := []string{fmt.Sprintf(`for=198.51.%d.%d;x="`, i/256, i%256), fmt.Sprintf(`for="_id%d";x="`, i)}[i%2]
		req := forwardedRequest("Forwarded", []string{client}, "for=203.0.113.9", proxyAppend(i/2%2))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		codes[rec.Code]++
	}
	assert.Equal(t, map[int]int{200: 5, 429: 995}, codes)
}
