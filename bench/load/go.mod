module outboxd/bench/load

go 1.26

require (
	github.com/google/go-cmp v0.7.0
	github.com/lib/pq v1.12.3
)
