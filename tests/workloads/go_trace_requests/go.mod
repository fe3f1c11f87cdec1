module ddprof.tests/go_trace_requests

go 1.19
