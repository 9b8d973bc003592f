#!/bin/bash
set -e
echo "$(cat /app/greeting.txt) world" > /app/hello.txt
