package httplimit

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClientIP(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	tests := []struct {
		name       string
		trusted    []netip.Prefix
		remoteAddr string
		xff        []string // X-Forwarded-For lines
		realIP     string
		want       string
		wantErr    string
	}{
		{name: "peer, no proxies trusted", remoteAddr: "198.51.100.7:4711", want: "198.51.100.7"},
		{name: "headers ignored without trusted proxies", remoteAddr: "198.51.100.7:4711", xff: []string{"203.0.113.1"}, realIP: "203.0.113.2", want: "198.51.100.7"},
		{name: "headers ignored from an untrusted peer", trusted: proxies, remoteAddr: "198.51.100.7:4711", xff: []string{"203.0.113.1"}, realIP: "203.0.113.2", want: "198.51.100.7"},
		{name: "IPv6 peer", remoteAddr: "[2001:db8::1]:443", want: "2001:db8::1"},
		{name: "IPv6 peer with zone", remoteAddr: "[fe80::1%eth0]:443", want: "fe80::1"},
		{name: "IPv4-mapped peer", remoteAddr: "[::ffff:198.51.100.7]:80", want: "198.51.100.7"},
		{name: "peer without port", remoteAddr: "198.51.100.7", want: "198.51.100.7"},
		{name: "trusted proxy, one hop", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"203.0.113.1"}, want: "203.0.113.1"},
		{name: "spoofed entries left of the client are ignored", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"1.1.1.1, 203.0.113.1"}, want: "203.0.113.1"},
		{name: "trusted hops skipped right to left", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"1.1.1.1, 203.0.113.1, 10.9.9.9,10.8.8.8"}, want: "203.0.113.1"},
		{name: "several header lines form one list", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"1.1.1.1", "203.0.113.1, 10.9.9.9"}, want: "203.0.113.1"},
		{name: "all hops trusted: leftmost", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"10.5.5.5, 10.9.9.9"}, want: "10.5.5.5"},
		{name: "entries with ports and brackets", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"[2001:db8::7]:5000, 10.9.9.9:81"}, want: "2001:db8::7"},
		{name: "bracketed IPv6 without port", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"[2001:db8::7]"}, want: "2001:db8::7"},
		{name: "trusted IPv6 proxy", trusted: proxies, remoteAddr: "[2001:db8:ffff::1]:80", xff: []string{"2001:db8::7"}, want: "2001:db8::7"},
		{name: "empty entries skipped", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"203.0.113.1, ,"}, want: "203.0.113.1"},
		{name: "only empty entries: the proxy", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{" , "}, realIP: "203.0.113.2", want: "10.1.2.3"},
		{name: "X-Real-IP is not read in X-Forwarded-For mode", trusted: proxies, remoteAddr: "10.1.2.3:80", realIP: " 203.0.113.2 ", want: "10.1.2.3"},
		{name: "trusted proxy without headers: the proxy", trusted: proxies, remoteAddr: "10.1.2.3:80", want: "10.1.2.3"},
		{name: "garbage before the client is never read", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"not-an-ip, 203.0.113.1"}, want: "203.0.113.1"},
		{name: "garbage from a trusted proxy", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"203.0.113.1, unknown"}, wantErr: `X-Forwarded-For entry "unknown" from a trusted proxy: not an IP address`},
		{name: "RemoteAddr not an address", remoteAddr: "@", wantErr: `RemoteAddr "@": not an IP address (a unix socket peer is trusted only with Proxies.UnixSocket)`},
		{name: "RemoteAddr empty", remoteAddr: "", wantErr: `RemoteAddr ""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = tt.remoteAddr
			for _, line := range tt.xff {
				req.Header.Add("X-Forwarded-For", line)
			}
			if tt.realIP != "" {
				req.Header.Set("X-Real-IP", tt.realIP)
			}
			got, err := ClientIP(tt.trusted...)(req)
			if tt.wantErr != "" {
				require.Error(t, err, "want an error, got key %q", got)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// A prefix given unmasked (10.1.2.3/8) means the same as its network.
func TestClientIPMasksPrefixes(t *testing.T) {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "10.200.0.1:80"
	req.Header.Set("X-Forwarded-For", "203.0.113.1")
	got, err := ClientIP(netip.MustParsePrefix("10.1.2.3/8"))(req)
	require.NoError(t, err)
	assert.Equal(t, "203.0.113.1", got)
}

func TestHeader(t *testing.T) {
	key := Header("x-api-key")
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	_, err := key(req)
	assert.ErrorIs(t, err, ErrMissingKey, "a missing header is the client's fault")
	assert.EqualError(t, err, "header X-Api-Key: missing or empty: httplimit: the request lacks its rate limit key")
	req.Header.Set("X-API-Key", "   ")
	_, err = key(req)
	assert.Error(t, err, "only spaces")
	req.Header.Set("X-API-Key", " k-123 ")
	got, err := key(req)
	require.NoError(t, err)
	assert.Equal(t, "k-123", got)
}

// Each attempt of a client to choose its own key, behind proxies that set
// one header or another: the header the proxy sets is read, and only it.
func TestClientIPSpoofing(t *testing.T) {
	proxy := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	tests := []struct {
		name    string
		proxies Proxies
		remote  string
		headers map[string][]string
		want    string
	}{
		{
			name:    "proxy sets X-Real-IP and passes the client's X-Forwarded-For",
			proxies: Proxies{Header: "X-Real-IP", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"X-Real-Ip": {"203.0.113.9"}, "X-Forwarded-For": {"1.2.3.4"}},
			want:    "203.0.113.9",
		},
		{
			name:    "client sends its own X-Real-IP, the proxy sets the last line",
			proxies: Proxies{Header: "X-Real-IP", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"X-Real-Ip": {"1.2.3.4", "203.0.113.9"}},
			want:    "203.0.113.9",
		},
		{
			name:    "proxy sends only Forwarded: its for= is the client",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {"for=203.0.113.9;proto=https"}},
			want:    "203.0.113.9",
		},
		{
			name:    "proxy sends only Forwarded, client sends X-Forwarded-For",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {"for=203.0.113.9"}, "X-Forwarded-For": {"6.6.6.6"}},
			want:    "203.0.113.9",
		},
		{
			name:    "client's own Forwarded element left of the proxy's is not believed",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for=6.6.6.6, for="203.0.113.9:4711";by=10.0.0.1`}},
			want:    "203.0.113.9",
		},
		{
			name:    "Forwarded: IPv6 in brackets with a port, trusted hops skipped",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for=6.6.6.6`, `For="[2001:db8:cafe::17]:4711", for=10.2.2.2`}},
			want:    "2001:db8:cafe::17",
		},
		{
			name:    "Forwarded: a quoted comma does not split the element",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for=6.6.6.6;ext="a,for=1.1.1.1", for=203.0.113.9`}},
			want:    "203.0.113.9",
		},
		{
			name:    "Forwarded: quoted-pairs in a quoted value are undone",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for="203.0.113.\9:4711"`}},
			want:    "203.0.113.9",
		},
		{
			name:    "Forwarded: the proxy hid the client",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for=6.6.6.6, for=unknown`}},
			want:    "unknown",
		},
		{
			name:    "Forwarded: an obfuscated identifier",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for=6.6.6.6, for="_gazonk"`}},
			want:    "_gazonk",
		},
		{
			name:    "Forwarded: an obfuscated identifier with a port shares the identifier's key",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for="_gazonk:40001"`}},
			want:    "_gazonk",
		},
		{
			name:    "Forwarded: an obfuscated identifier with an obfuscated port",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for="_gazonk:_p7"`}},
			want:    "_gazonk",
		},
		{
			name:    "Forwarded: an address with an obfuscated port (RFC 7239 6.3)",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for="192.0.2.43:_abc"`}},
			want:    "192.0.2.43",
		},
		{
			name:    "Forwarded: an IPv6 address with an obfuscated port",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for="[2001:db8::1]:_p-1.x"`}},
			want:    "2001:db8::1",
		},
		{
			name:    "Forwarded: unknown with a port",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for="unknown:4711"`}},
			want:    "unknown",
		},
		{
			name:    "Forwarded: unknown in any case",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"Forwarded": {`for=UNKNOWN`}},
			want:    "unknown",
		},
		{
			name:    "headers from an untrusted peer are ignored",
			proxies: Proxies{Header: "Forwarded", Trusted: proxy},
			remote:  "198.51.100.7:80",
			headers: map[string][]string{"Forwarded": {"for=6.6.6.6"}},
			want:    "198.51.100.7",
		},
		{
			name:    "IPv4-mapped trusted prefix matches the proxy",
			proxies: Proxies{Trusted: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}},
			remote:  "10.0.0.1:80",
			headers: map[string][]string{"X-Forwarded-For": {"203.0.113.9"}},
			want:    "203.0.113.9",
		},
		{
			name:    "IPv4-mapped trusted prefix matches a mapped peer",
			proxies: Proxies{Trusted: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}},
			remote:  "[::ffff:10.0.0.1]:80",
			headers: map[string][]string{"X-Forwarded-For": {"203.0.113.9"}},
			want:    "203.0.113.9",
		},
		{
			name:    "unix socket peer, trusted",
			proxies: Proxies{UnixSocket: true},
			remote:  "@",
			headers: map[string][]string{"X-Forwarded-For": {"6.6.6.6, 203.0.113.9"}},
			want:    "203.0.113.9",
		},
		{
			name:    "unix socket peer with 0.0.0.0/0 trusted and an empty RemoteAddr",
			proxies: Proxies{Header: "X-Real-IP", Trusted: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, UnixSocket: true},
			remote:  "",
			headers: map[string][]string{"X-Real-Ip": {"203.0.113.9"}},
			want:    "203.0.113.9",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = tt.remote
			for name, lines := range tt.headers {
				for _, line := range lines {
					req.Header.Add(name, line)
				}
			}
			got, err := ClientIPBehind(tt.proxies)(req)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestClientIPErrors(t *testing.T) {
	proxy := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	tests := []struct {
		name    string
		proxies Proxies
		remote  string
		header  string
		value   string
		wantErr string
	}{
		{name: "bad X-Real-IP", proxies: Proxies{Header: "X-Real-IP", Trusted: proxy}, remote: "10.0.0.1:80", header: "X-Real-IP", value: "example.com", wantErr: `X-Real-IP "example.com" from a trusted proxy: not an IP address`},
		{name: "bad Forwarded for=", proxies: Proxies{Header: "Forwarded", Trusted: proxy}, remote: "10.0.0.1:80", header: "Forwarded", value: "for=example.com", wantErr: `Forwarded for="example.com"`},
		{name: "Forwarded pair without =", proxies: Proxies{Header: "Forwarded", Trusted: proxy}, remote: "10.0.0.1:80", header: "Forwarded", value: "for", wantErr: "syntax error at its end"},
		{name: "Forwarded unterminated quote", proxies: Proxies{Header: "Forwarded", Trusted: proxy}, remote: "10.0.0.1:80", header: "Forwarded", value: `for="1.2.3.4`, wantErr: "syntax error at its end"},
		{name: "Forwarded garbage after the proxy's element", proxies: Proxies{Header: "Forwarded", Trusted: proxy}, remote: "10.0.0.1:80", header: "Forwarded", value: `for=203.0.113.9, for=1.1.1.1;x="`, wantErr: "syntax error at its end"},
		{name: "long garbage is cut in the message", proxies: Proxies{Header: "X-Real-IP", Trusted: proxy}, remote: "10.0.0.1:80", header: "X-Real-IP", value: strings.Repeat("x", 10000), wantErr: "…"},
		{name: "unix socket without a header", proxies: Proxies{UnixSocket: true}, remote: "@", wantErr: "trusted unix socket peer sent no X-Forwarded-For"},
		{name: "unix socket not trusted", proxies: Proxies{Trusted: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}, remote: "@", wantErr: "Proxies.UnixSocket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = tt.remote
			if tt.header != "" {
				req.Header.Set(tt.header, tt.value)
			}
			got, err := ClientIPBehind(tt.proxies)(req)
			require.Error(t, err, "want an error, got key %q", got)
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.Less(t, len(err.Error()), 300, "an error must not grow with the header")
		})
	}
}

// Setup mistakes fail at start-up, not on the first request.
func TestClientIPPanicsOnBadSetup(t *testing.T) {
	for name, fn := range map[string]func(){
		"unknown header":             func() { ClientIPBehind(Proxies{Header: "X-Client-IP"}) },
		"mapped prefix shorter /96":  func() { ClientIP(netip.MustParsePrefix("::ffff:0.0.0.0/80")) },
		"invalid prefix":             func() { ClientIP(netip.Prefix{}) },
		"empty header name":          func() { Header("") },
		"header name with a space":   func() { Header("X API Key") },
		"header name with a newline": func() { Header("X-Key\n") },
	} {
		t.Run(name, func(t *testing.T) {
			assert.Panics(t, fn)
		})
	}
}

// TestClientIPHeaderWorkIsBounded sends a trusted proxy's header after a
// client's line of 64 KiB of empty list elements or unreadable text: the
// key is still the proxy's, and reading it allocates no more than a few
// bytes per header byte (it took 16 to 145 when every empty element was
// kept).
func TestClientIPHeaderWorkIsBounded(t *testing.T) {
	proxy := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	const size = 64 << 10
	tests := []struct {
		header, client, proxyPart string
	}{
		{"Forwarded", strings.Repeat(",", size), ", for=203.0.113.9"},
		{"Forwarded", strings.Repeat(";", size), ", for=203.0.113.9"},
		{"Forwarded", `x="` + strings.Repeat(",", size), ", for=203.0.113.9"},
		{"Forwarded", strings.Repeat("for=10.0.0.9,", size/13), " for=203.0.113.9"},
		{"X-Forwarded-For", strings.Repeat(",", size), ", 203.0.113.9"},
		{"X-Forwarded-For", strings.Repeat("10.0.0.9,", size/9), " 203.0.113.9"},
	}
	for _, tt := range tests {
		t.Run(tt.header+" "+tt.client[:4], func(t *testing.T) {
			keyFunc := ClientIPBehind(Proxies{Header: tt.header, Trusted: proxy})
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = "10.0.0.1:80"
			req.Header.Add(tt.header, tt.client+tt.proxyPart)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			key, err := keyFunc(req)
			runtime.ReadMemStats(&after)
			require.NoError(t, err)
			assert.Equal(t, "203.0.113.9", key)
			perByte := float64(after.TotalAlloc-before.TotalAlloc) / size
			assert.LessOrEqual(t, perByte, 4.0, "bytes allocated per header byte")
		})
	}
}
