package main

import (
	"encoding/xml"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBurstyIsSeeded(t *testing.T) {
	a, b := bursty(1, 20*time.Second), bursty(1, 20*time.Second)
	require.NotEmpty(t, a)
	assert.Equal(t, a, b, "same seed, same trace")
	assert.NotEqual(t, a, bursty(2, 20*time.Second), "another seed, another trace")
	assert.True(t, slices.IsSorted(a), "sorted")
	assert.Less(t, a[len(a)-1], 20*time.Second, "inside the trace's length")
}

func TestMaxInWindow(t *testing.T) {
	s := []time.Duration{0, time.Second, 1999 * time.Millisecond, 2 * time.Second, 3 * time.Second}
	assert.Equal(t, 3, maxInWindow(s, 2*time.Second), "[1s, 3s) holds 1s, 1.999s and 2s")
	assert.Equal(t, 0, maxInWindow(nil, time.Second))
	n, from := busiestSpan(s, 2*time.Second)
	assert.Equal(t, 3, n)
	assert.Equal(t, time.Duration(0), from, "the earliest busiest span: [0, 2s) holds 0, 1s and 1.999s")
}

// A fixed window opens at the first request that finds none open.
func TestFixedWindowStarts(t *testing.T) {
	s := []time.Duration{500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 2600 * time.Millisecond, 7 * time.Second}
	assert.Equal(t, []time.Duration{500 * time.Millisecond, 2500 * time.Millisecond, 7 * time.Second}, fixedWindowStarts(s, 2*time.Second))
}

// Every request gets one decision per lane, and the chart is well-formed
// XML with one lane label per algorithm.
func TestReplayAndChart(t *testing.T) {
	d := 20 * time.Second
	trace := bursty(7, d)
	ls := lanes()
	require.NoError(t, replay(trace, ls))
	for _, l := range ls {
		assert.Equal(t, len(trace), len(l.admitted)+len(l.denied), "%s: one decision per request", l.name)
		assert.NotEmpty(t, l.denied, "%s: a bursty trace above the rate is denied sometimes", l.name)
	}
	tb := ls[len(ls)-1]
	assert.Equal(t, ls[len(ls)-2].admitted, tb.admitted, "leaky and token bucket decide alike at equal capacity and rate")
	assert.LessOrEqual(t, len(tb.admitted), burst+int(d.Seconds())*ratePerSecond, "a token bucket admits at most its burst plus its rate")

	svg := chart(trace, ls, d, 7)
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "the SVG must be well-formed XML")
	}
	for _, l := range ls {
		assert.Contains(t, svg, ">"+l.name+"<", "lane label")
	}
}
