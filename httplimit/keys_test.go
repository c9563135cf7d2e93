package httplimit

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
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
		{name: "only empty entries: X-Real-IP", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{" , "}, realIP: "203.0.113.2", want: "203.0.113.2"},
		{name: "X-Real-IP from a trusted proxy", trusted: proxies, remoteAddr: "10.1.2.3:80", realIP: " 203.0.113.2 ", want: "203.0.113.2"},
		{name: "X-Forwarded-For before X-Real-IP", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"203.0.113.1"}, realIP: "203.0.113.2", want: "203.0.113.1"},
		{name: "trusted proxy without headers: the proxy", trusted: proxies, remoteAddr: "10.1.2.3:80", want: "10.1.2.3"},
		{name: "garbage before the client is never read", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"not-an-ip, 203.0.113.1"}, want: "203.0.113.1"},
		{name: "garbage from a trusted proxy", trusted: proxies, remoteAddr: "10.1.2.3:80", xff: []string{"203.0.113.1, unknown"}, wantErr: `X-Forwarded-For entry "unknown" from trusted proxy 10.1.2.3: not an IP address`},
		{name: "bad X-Real-IP", trusted: proxies, remoteAddr: "10.1.2.3:80", realIP: "example.com", wantErr: `X-Real-IP "example.com"`},
		{name: "RemoteAddr not an address", remoteAddr: "@", wantErr: `RemoteAddr "@": not an IP address`},
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
	assert.EqualError(t, err, "header X-Api-Key: missing or empty")
	req.Header.Set("X-API-Key", "   ")
	_, err = key(req)
	assert.Error(t, err, "only spaces")
	req.Header.Set("X-API-Key", " k-123 ")
	got, err := key(req)
	require.NoError(t, err)
	assert.Equal(t, "k-123", got)
}
