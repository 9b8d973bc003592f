#!/bin/bash
# Never finishes in time: the test SIGKILLs Harbor while this runs.
sleep 600
