module outboxd/bench/load

go 1.26

require github.com/lib/pq v1.12.3
