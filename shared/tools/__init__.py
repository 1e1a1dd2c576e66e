"""numafit's tools, built on the library and the test doubles: the `numafit` command (`cli`),
`numafit plan` (`plan`), `numafit simulate` and `numafit demo` (`simulate`), `numafit up`
(`local`) and `numafit bench` (`bench*`)."""
