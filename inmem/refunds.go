package inmem

// refunds is what refunds gave back of the grants a key still counts, as
// the scripts keep it (DESIGN "Grants and refunds": at most once): per
// refunded grant, named by a position that no other grant of the same
// window or period has, the permits given back; at most maxRefundRecords
// of them, the oldest dropped first, and a horizon at or before which a
// grant gives nothing back any more (stricter, never looser).
type refunds struct {
	records []refundRecord
	horizon int64
}

// refundRecord is what refunds of one grant, at position at, gave back.
type refundRecord struct{ at, back int64 }

// maxRefundRecords is the most refunded grants a key remembers, as in the
// scripts.
const maxRefundRecords = 16

// given returns what the grant at position at gave back so far, and
// whether it may give back more (it is past the horizon).
func (r *refunds) given(at int64) (back int64, ok bool) {
	if at <= r.horizon {
		return 0, false
	}
	for _, rec := range r.records {
		if rec.at == at {
			return rec.back, true
		}
	}
	return 0, true
}

// record sets what the grant at position at gave back in all to back. The
// records are copied first: a state is a value that shares them with the
// stored one until it is put.
func (r *refunds) record(at, back int64) {
	records := make([]refundRecord, 0, len(r.records)+1)
	for _, rec := range r.records {
		if rec.at != at {
			records = append(records, rec)
		}
	}
	records = append(records, refundRecord{at: at, back: back})
	if len(records) > maxRefundRecords {
		oldest := 0
		for i, rec := range records {
			if rec.at < records[oldest].at {
				oldest = i
			}
		}
		r.horizon = max(r.horizon, records[oldest].at)
		records = append(records[:oldest], records[oldest+1:]...)
	}
	r.records = records
}
